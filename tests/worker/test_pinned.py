"""The engine's module-wide buffers serve callers in and out of inference mode; the pinned
rings hand out their buffers in turn, growing them; the packed upload against plain copies."""

import numpy as np
import pytest
import torch

from loom.kernels import arrival
from loom.pinned import PinnedRing, pinned_empty, upload

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


def test_arrival_counters_made_in_inference_mode_take_writes_outside_it():
    """Tests zero the counters between launches; the first launch may be an engine's."""
    with torch.inference_mode():
        counters = arrival.counters(torch.device("cpu"), 4, "test_pinned")
    counters[:4].fill_(3)
    assert counters.count_nonzero() == 4
    counters.zero_()


def test_ring_hands_out_its_buffers_in_turn_and_grows_them():
    ring = PinnedRing(3, torch.int64, min_numel=4)
    first = [ring.take(2) for _ in range(3)]
    assert len({b.data_ptr() for b in first}) == 3 and all(b.dtype == torch.int64 for b in first)
    again = ring.take(4)  # the first buffer's turn again, and it still fits
    assert again.data_ptr() == first[0].data_ptr() and again.numel() == 4
    grown = ring.take(5)  # the second outgrows its 4 entries: a new buffer, at least doubled
    assert grown.numel() == 5 and grown.untyped_storage().nbytes() >= 8 * 8


def test_upload_off_cuda_is_the_arrays_themselves():
    arrays = [np.arange(5, dtype=np.int64), np.array([[1, 2], [3, 4]], dtype=np.int32)]
    out = upload(arrays, torch.device("cpu"))
    assert [t.dtype for t in out] == [torch.int64, torch.int32]
    assert [t.tolist() for t in out] == [a.tolist() for a in arrays]


@pytest.mark.gpu
@needs_cuda
def test_upload_packs_arrays_aligned_and_equal_to_plain_copies():
    cuda = torch.device("cuda")
    rng = np.random.default_rng(0)
    for _ in range(20):  # more uploads than the ring has buffers, of varying sizes
        arrays = [rng.integers(-9, 9, size=int(rng.integers(0, 300))).astype(dt)
                  for dt in (np.int64, np.int32, np.int32)]
        out = upload(arrays, cuda)
        assert all(t.data_ptr() % 256 == 0 for t in out)
        assert [t.cpu().tolist() for t in out] == [a.tolist() for a in arrays]


@pytest.mark.gpu
@needs_cuda
def test_rings_filled_in_inference_mode_serve_callers_outside_it():
    cuda = torch.device("cuda")
    ring = PinnedRing(1, torch.int64)
    with torch.inference_mode():
        upload([np.arange(4, dtype=np.int32)], cuda)
        ring.take(4).copy_(torch.arange(4, device=cuda))
    # the same buffers again, now outside inference mode
    for _ in range(8):  # every buffer of the shared staging ring
        host = np.arange(8, dtype=np.int32) * 3
        assert upload([host], cuda)[0].cpu().tolist() == host.tolist()
    back = ring.take(8)
    back.copy_(torch.arange(8, device=cuda) * 5)
    torch.cuda.synchronize()
    assert back.tolist() == [i * 5 for i in range(8)]
