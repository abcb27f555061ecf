"""The engine's module-wide pinned rings serve callers in and out of inference mode."""

import pytest
import torch

from loom.attention.mixed_split import _PinnedRing
from loom.pinned import pinned_empty
from loom.worker.step_handle import _ReadbackRing

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_a_buffer_made_in_inference_mode_takes_writes_outside_it():
    with torch.inference_mode():
        buf = pinned_empty(8, torch.int32)
        buf[:4].copy_(torch.arange(4, dtype=torch.int32))  # and inside it
    assert not buf.is_inference()
    buf.copy_(torch.arange(8, dtype=torch.int32))
    assert buf.tolist() == list(range(8))
    # torch's own allocation, for contrast: the failure pinned_empty avoids
    with torch.inference_mode():
        plain = torch.empty(8, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="[Ii]nference"):
        plain.copy_(torch.arange(8, dtype=torch.int32))


@pytest.mark.gpu
@needs_cuda
def test_rings_filled_in_inference_mode_serve_callers_outside_it():
    cuda = torch.device("cuda")
    uploads, readbacks = _PinnedRing(size=1), _ReadbackRing(size=1)
    with torch.inference_mode():
        uploads.upload(torch.arange(4, dtype=torch.int32), cuda)
        readbacks.take(4).copy_(torch.arange(4, device=cuda))
    # the same buffers again (one per ring), now outside inference mode
    host = torch.arange(8, dtype=torch.int32) * 3
    assert uploads.upload(host, cuda).cpu().tolist() == host.tolist()
    back = readbacks.take(8)
    back.copy_(torch.arange(8, device=cuda) * 5)
    torch.cuda.synchronize()
    assert back.tolist() == [i * 5 for i in range(8)]
