"""The Triton backend's SDPA path pads each request to a multiple of SDPA_BUCKET (cuDNN builds
a graph per shape) and start-up runs every padded length once: the padding changes nothing,
and the warm-up's calls have exactly the layout a step's calls have."""

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.test_paged_attention import make_batch  # noqa: E402

from loom.attention import triton_backend as tb  # noqa: E402
from loom.attention.triton_backend import SDPA_BUCKET, TritonBackend, TritonTiles  # noqa: E402


def _unpadded(q, k, v, scale):
    """torch's SDPA at the request's own length, in float64."""
    o = F.scaled_dot_product_attention(*(t.double().transpose(0, 1)[None] for t in (q, k, v)),
                                       is_causal=True, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)


@pytest.mark.parametrize("n", [1, 7, SDPA_BUCKET - 1, SDPA_BUCKET, SDPA_BUCKET + 3])
def test_padding_changes_nothing(n):
    qkv = torch.randn(n, 4 + 2 * 2, 16)  # strided views of one fused tensor, as a step has
    q, k, v = qkv[:, :4], qkv[:, 4:6], qkv[:, 6:]
    out = tb.sdpa_causal(q, k, v, 0.3)
    assert out.shape == q.shape
    torch.testing.assert_close(out.double(), _unpadded(q, k, v, 0.3), atol=1e-5, rtol=1e-5)


def test_nan_past_the_request_does_not_leak():
    # the buffers' padding is zeroed: were it left as allocated, NaN could reach real rows
    # through P @ V (0 * NaN)
    q, k, v = (torch.randn(5, h, 16) for h in (4, 2, 2))
    real = torch.empty
    torch.empty = lambda *a, **kw: real(*a, **kw).fill_(float("nan"))
    try:
        out = tb.sdpa_causal(q, k, v, 0.25)
    finally:
        torch.empty = real
    torch.testing.assert_close(out.double(), _unpadded(q, k, v, 0.25), atol=1e-5, rtol=1e-5)


def _record_sdpa(monkeypatch):
    seen = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        seen.append(tuple((t.shape, t.stride(), t.dtype) for t in args[:3])
                    + (kwargs["scale"], kwargs["is_causal"]))
        return real(*args, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return seen


def test_warm_up_runs_each_padded_length_as_a_step_does(monkeypatch):
    seen = _record_sdpa(monkeypatch)
    backend = TritonBackend(TritonTiles(sdpa_min_tokens=0))
    lengths = backend.warm_up_sdpa(4, 2, 16, torch.float32, torch.device("cpu"), 0.25,
                                   2 * SDPA_BUCKET + 1)
    assert lengths == [SDPA_BUCKET, 2 * SDPA_BUCKET, 3 * SDPA_BUCKET]
    assert [s[0][0][2] for s in seen] == lengths
    warmed = set(seen)
    seen.clear()
    # a step's fresh prompts, through the backend, take calls the warm-up has made
    batch = make_batch([SDPA_BUCKET + 5, 3], [SDPA_BUCKET + 5, 3], 4, 2, 16, 16)
    backend.forward(batch.query, batch.kv_cache, batch.meta, 0.25,
                    (batch.key, batch.value))
    assert len(seen) == 2 and set(seen) <= warmed


def test_warm_up_skips_where_sdpa_never_runs(monkeypatch):
    seen = _record_sdpa(monkeypatch)
    args = (4, 2, 16, torch.float32, torch.device("cpu"), 0.25)
    assert TritonBackend(TritonTiles(sdpa_max_reqs=0)).warm_up_sdpa(*args, 4096) == []
    assert TritonBackend(TritonTiles(sdpa_min_tokens=3000)).warm_up_sdpa(*args, 2999) == []
    assert seen == []
