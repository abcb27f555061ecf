"""Sliding windows and score softcaps (`ScoreOpts`) in the Triton attention kernels, against
the torch reference, and the reference's window against transformers' own mask function.
On the CPU in Triton's interpreter, small shapes; with CUDA compiled, in bf16 (`-m gpu`).
Helpers are test_paged_attention's."""

import logging
import zlib

import pytest
import torch

# First: it picks the interpreter (TRITON_INTERPRET) before anything imports Triton.
from tests.kernels.test_paged_attention import (GPU_CASES, Batch, _spy_kernels, cpu_only,
                                                make_batch, needs_gpu)

from loom.attention.backend import ScoreOpts
from loom.attention.torch_native import TorchNativeBackend, attend
from loom.attention.triton_backend import TritonBackend, TritonTiles
from loom.kernels.kv_write import write_kv_cache
from loom.kernels.paged_attention import paged_prefill
from tests.kernels.test_packed_prefill import fixed_shape


@pytest.fixture(autouse=True)
def _seeded(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


OPTS = {"window": ScoreOpts(sliding_window=24), "softcap": ScoreOpts(softcap=2.0),
        "window-softcap": ScoreOpts(sliding_window=7, softcap=2.0)}
# SDPA on for any fresh prefill: a windowed or softcapped layer must not take it
TILES = TritonTiles(prefill_block_m=16, prefill_block_n=16, decode_block_n=16, num_splits=4,
                    sdpa_max_reqs=8, sdpa_min_tokens=0)
# (query_lens, seq_lens, heads, kv_heads, head_dim, block_size, pad): contexts longer and
# shorter than the windows, chunks that start before a window and end past it
CASES = {
    "decode": ([1, 1, 1], [70, 20, 41], 4, 2, 32, 16, 1),
    "mixed": ([1, 30, 1, 9], [75, 53, 16, 9], 4, 1, 32, 16, 2),
    "prefill": ([40, 6], [40, 6], 4, 2, 16, 16, 0),
}


def reference(batch: Batch, scale: float, opts: ScoreOpts) -> torch.Tensor:
    cache = batch.kv_cache.float().clone()
    native = TorchNativeBackend()
    native.write_kv(batch.key.float(), batch.value.float(), cache, batch.meta.slot_mapping)
    return native.forward(batch.query.float(), cache, batch.meta, scale, opts=opts)


def test_reference_window_is_transformers_mask():
    """A query at p sees the keys at (p - window, p]: transformers'
    sliding_window_causal_mask_function, checked key by key, softcap after the scale."""
    from transformers.masking_utils import sliding_window_causal_mask_function
    window, cap, scale = 5, 1.5, 0.3
    q, k, v = torch.randn(9, 2, 8), torch.randn(20, 1, 8), torch.randn(20, 1, 8)
    allowed = sliding_window_causal_mask_function(window)
    want = torch.empty_like(q)
    for i in range(9):
        pos = 11 + i  # the last 9 of 20 positions
        seen = [j for j in range(20) if allowed(0, 0, torch.tensor(pos), torch.tensor(j))]
        assert seen == list(range(pos - window + 1, pos + 1))
        s = torch.tanh((q[i] @ k[seen, 0].T) * scale / cap) * cap
        want[i] = torch.softmax(s, dim=-1) @ v[seen, 0]
    got = attend(q, k, v, scale, ScoreOpts(window, cap))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@cpu_only
@pytest.mark.parametrize("opts", OPTS.values(), ids=OPTS.keys())
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_backend_matches_reference(case, opts, monkeypatch, caplog):
    """Decodes (split-K, splits over the window's keys), chunks beside them and fresh
    prefills (never SDPA, said once in the log) give the reference's rows."""
    q_lens, s_lens, h, hkv, d, bs, pad = case
    batch = make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad)
    scale = d ** -0.5
    ref = reference(batch, scale, opts)
    calls = _spy_kernels(monkeypatch)
    backend = TritonBackend(TILES)
    backend.write_kv(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    with caplog.at_level(logging.INFO, logger="loom.attention.triton_backend"):
        assert not backend.attends_batch_kv(batch.meta, batch.kv_cache, batch.key, opts)
        out = backend.forward(batch.query, batch.kv_cache, batch.meta, scale, opts=opts)
        backend.forward(batch.query, batch.kv_cache, batch.meta, scale, opts=opts)
    n = batch.meta.num_actual_tokens
    torch.testing.assert_close(out[:n], ref[:n], atol=1e-4, rtol=1e-4)
    assert bool((out[n:] == 0).all())
    assert all(c["window"] == opts.sliding_window and c["softcap"] == opts.softcap
               for c in calls)
    if max(q_lens) > 1 and batch.meta.is_fresh_prefill:
        assert calls and caplog.text.count("not SDPA") == 1


@cpu_only
@pytest.mark.parametrize("window", [5, 40], ids=["narrower-than-a-tile", "several-tiles"])
@pytest.mark.parametrize("mask_all", [False, True], ids=["unmasked-interior", "mask-all"])
def test_prefill_tiles_around_the_window(window, mask_all):
    """Query tiles of 8 tokens over 16-key tiles after long contexts: a window narrower
    than a query tile (rows that see nothing of the first tiles read), and one spanning
    masked, whole and masked tiles again."""
    batch = make_batch([37, 20, 5], [37 + 70, 20, 5 + 33], 4, 2, 32, 16, pad=2)
    m, scale, opts = batch.meta, 32 ** -0.5, ScoreOpts(sliding_window=window)
    ref = reference(batch, scale, opts)
    write_kv_cache(batch.key, batch.value, batch.kv_cache, m.slot_mapping)
    out = torch.full_like(batch.query, float("nan"))
    paged_prefill(batch.query, batch.kv_cache, out, m.block_table, m.query_start_loc,
                  m.seq_lens, m.num_reqs, m.max_query_len, scale, block_m=16, block_n=16,
                  mask_all=mask_all, window=window)
    n = m.num_actual_tokens
    torch.testing.assert_close(out[:n], ref[:n], atol=1e-4, rtol=1e-4)


@cpu_only
def test_fixed_shape_batch_with_window_and_softcap():
    """A CUDA graph's packed launch (requests to spare, padding rows) honours both."""
    batch = make_batch(*CASES["mixed"][:-1], pad=5)
    opts, scale = OPTS["window-softcap"], 32 ** -0.5
    ref = reference(batch, scale, opts)
    backend = TritonBackend(TILES)
    backend.write_kv(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    meta = fixed_shape(batch.meta, 6, batch.query.shape[0])
    out = backend.forward(batch.query, batch.kv_cache, meta, scale, opts=opts)
    n = batch.meta.num_actual_tokens
    torch.testing.assert_close(out[:n], ref[:n], atol=1e-4, rtol=1e-4)
    assert bool((out[n:] == 0).all())


@cpu_only
def test_decode_rope_with_window_and_softcap():
    """The decode kernel that rotates and caches the new token itself: the new key lands
    in the split that reads it, the window's first keys in the first split."""
    from loom.attention.backend import AttentionBackend
    from loom.layers.rotary import RotaryEmbedding
    batch = make_batch([1, 1, 1], [70, 20, 41], 4, 2, 32, 16, pad=1)
    m, scale, opts = batch.meta, 32 ** -0.5, OPTS["window"]
    cos_sin = RotaryEmbedding(32, 128, 10000.0).cos_sin_cache
    positions = torch.cat([m.seq_lens.long() - 1, torch.zeros(1, dtype=torch.long)])
    ref_cache = batch.kv_cache.clone()
    native = TorchNativeBackend()
    q_rot = AttentionBackend.rope_write_kv(native, batch.query, batch.key, batch.value,
                                           positions, cos_sin, ref_cache, m.slot_mapping)
    ref = native.forward(q_rot, ref_cache, m, scale, opts=opts)
    out = TritonBackend(TILES).decode_rope(batch.query, batch.key, batch.value, positions,
                                           cos_sin, batch.kv_cache, m, scale, None, opts)
    torch.testing.assert_close(batch.kv_cache, ref_cache, equal_nan=True)
    n = m.num_actual_tokens
    torch.testing.assert_close(out[:n], ref[:n], atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", GPU_CASES.values(), ids=GPU_CASES.keys())
@pytest.mark.parametrize("opts", [ScoreOpts(300), ScoreOpts(4096, 20.0), ScoreOpts(None, 20.0)],
                         ids=["window", "window-softcap", "softcap"])
def test_gpu_bf16(case, opts):
    q_lens, s_lens, h, hkv, d, bs, pad = case
    batch = make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad, dtype=torch.bfloat16,
                       device="cuda")
    scale = d ** -0.5
    ref = reference(batch, scale, opts)
    backend = TritonBackend(TritonTiles(sdpa_min_tokens=0))
    backend.write_kv(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    out = backend.forward(batch.query, batch.kv_cache, batch.meta, scale, opts=opts)
    n = batch.meta.num_actual_tokens
    torch.testing.assert_close(out[:n].float(), ref[:n], atol=2e-2, rtol=2e-2)
