"""paged_decode's stacked tiles (`stack`): each split's keys in `stack` chunks side by side,
in the rows tl.dot's 16 would otherwise pad the GQA group with, folded back into one softmax
per head at the end. Against the torch backend on random batches (the cases' short requests
leave chunks with no keys), in Triton's CPU interpreter; compiled bf16 on CUDA (`-m gpu`)."""

import functools

import pytest
import torch

# First: it picks the interpreter (TRITON_INTERPRET) before anything imports Triton.
from tests.kernels import test_paged_attention_rope as rope_tests
from tests.kernels.test_kv_cache_fp8 import FP8, check, fp8_batch
from tests.kernels.test_kv_cache_fp8 import reference as fp8_reference
from tests.kernels.test_paged_attention import (  # noqa: F401  (_seed: the autouse fixture)
    _seed, _spy_kernels, cpu_only, make_batch, needs_gpu, reference)

from loom.attention.triton_backend import STACK_BLOCK_N, TritonBackend, TritonTiles  # noqa: E402
from loom.kernels import arrival  # noqa: E402
from loom.kernels.kv_write import write_kv_cache  # noqa: E402
from loom.kernels.paged_decode import max_stack, paged_decode  # noqa: E402

# (heads, kv_heads, head_dim, block_size, seq_lens, stack, splits, block_n)
CASES = {
    "gqa4-stack4": (8, 2, 64, 16, [150, 37, 1, 64, 17, 3], 4, 1, 16),
    "gqa4-stack4-splits": (8, 2, 64, 16, [150, 37, 1, 64, 17, 3], 4, 3, 16),
    "gqa4-stack2": (8, 2, 64, 16, [97, 5], 2, 2, 16),
    "gqa8-stack2-b32": (16, 2, 32, 32, [150, 37, 1, 200], 2, 2, 32),
    "gqa3-stack4": (6, 2, 64, 16, [99, 5, 33], 4, 1, 16),  # a padding head in each chunk
    "gqa1-stack8": (2, 2, 64, 16, [130, 16, 2], 8, 2, 16),  # 8 chunks of 64 dims
}


def _run(batch, stack, splits, block_n, out=None):
    m = batch.meta
    out = torch.full_like(batch.query, float("nan")) if out is None else out
    return paged_decode(batch.query, batch.kv_cache, out, m.block_table, m.query_start_loc,
                        m.seq_lens, m.num_reqs, batch.query.shape[-1] ** -0.5, splits,
                        block_n, stack=stack)


@cpu_only
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_stacked_tiles_match_the_reference(case):
    """Every request's output is the torch backend's, the padding row is left alone and no
    arrival counter is left counting; the unstacked kernel (stack 1) beside it agrees."""
    heads, kv_heads, d, bs, lens, stack, splits, block_n = case
    batch = make_batch([1] * len(lens), lens, heads, kv_heads, d, bs, pad=1)
    _, ref = reference(batch, d ** -0.5)
    write_kv_cache(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    counters = arrival.counters(torch.device("cpu"), 1, "paged_decode")
    counters.zero_()
    n = len(lens)
    stacked = _run(batch, stack, splits, block_n)
    torch.testing.assert_close(stacked[:n], ref[:n], atol=1e-4, rtol=1e-4)
    assert bool(stacked[n:].isnan().all()), "the padding row was written"
    assert int(counters.count_nonzero()) == 0
    torch.testing.assert_close(_run(batch, 1, splits, block_n)[:n], stacked[:n],
                               atol=1e-5, rtol=1e-5)


@cpu_only
def test_large_scores_fold_at_each_heads_max():
    """Queries 60 times larger: log2-domain scores in the hundreds, whose exp2 overflows
    float32 unless each chunk is rescaled to the head's max before the fold sums them."""
    batch = make_batch([1, 1], [150, 70], 8, 2, 64, 16)
    batch.query.mul_(60.0)
    _, ref = reference(batch, 64 ** -0.5)
    write_kv_cache(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    torch.testing.assert_close(_run(batch, 4, 1, 16)[:2], ref[:2], atol=1e-4, rtol=1e-4)


@cpu_only
@pytest.mark.parametrize("splits", [1, 3])
def test_stacked_tiles_rotate_and_cache_the_new_tokens(monkeypatch, splits):
    """With new_tokens: the split holding each request's new token rotates and caches it
    first, as without stacking (test_paged_attention_rope's checks, every decode stacked)."""
    monkeypatch.setattr(rope_tests, "paged_decode", functools.partial(paged_decode, stack=4))
    batch = make_batch([1] * 3, [150, 37, 1], 8, 2, 64, 16, pad=1)
    rope_tests.check_decode_with_new_tokens(batch, splits, 16, 1e-5, 1e-5)


@cpu_only
@pytest.mark.parametrize("fmt", FP8.values(), ids=FP8.keys())
@pytest.mark.parametrize("compute, tol", [(torch.float32, 1e-4), (torch.float16, 3e-3)],
                         ids=["fp32", "fp16-dots"])
def test_stacked_tiles_over_an_8bit_cache(fmt, compute, tol):
    """The backend asked to stack (TritonTiles.decode_stack) over an 8-bit cache, with
    float32 queries and with 16-bit ones (fp16 dots)."""
    case = ([1] * 4, [150, 37, 1, 64], 8, 2, 64, 16, 1)
    check(fp8_batch(case, fmt, compute=compute), fmt,
          TritonBackend(TritonTiles(decode_stack=4, num_splits=2)), atol=tol, rtol=tol)


@cpu_only
def test_the_backend_stacks_what_the_shape_allows(monkeypatch):
    """decode_stack (or LOOM_DECODE_STACK) asks; the backend caps it at what the GQA group
    leaves and takes tiles of STACK_BLOCK_N keys: a group of 4 takes up to 4, a group of
    8 up to 2; unasked, it does not stack."""
    calls = _spy_kernels(monkeypatch)
    for heads, want, got in ((8, 4, 4), (16, 4, 2), (8, None, 1)):
        batch = make_batch([1, 1], [40, 17], heads, 2, 64, 16)
        write_kv_cache(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
        _, ref = reference(batch, 64 ** -0.5)
        out = TritonBackend(TritonTiles(decode_stack=want)).forward(
            batch.query, batch.kv_cache, batch.meta, 64 ** -0.5)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
        (call,) = calls
        assert call["stack"] == got
        if got > 1:
            assert call["block_n"] == STACK_BLOCK_N
        calls.clear()
    monkeypatch.setenv("LOOM_DECODE_STACK", "2")
    assert TritonBackend().decode_stack(4, 128, 16) == 2


def test_max_stack():
    assert max_stack(4, 128, 16, 16) == 4   # Llama-3.1-8B: 4 heads a KV head, 16 rows
    assert max_stack(8, 128, 16, 16) == 2   # Qwen3-30B-A3B
    assert max_stack(16, 128, 16, 16) == 1  # no padding rows to fill
    assert max_stack(4, 256, 16, 16) == 2   # 512 columns at most
    assert max_stack(4, 128, 16, 32) == 1   # a chunk's tile must lie in one cache block


@cpu_only
@pytest.mark.parametrize("stack, block_n, block_size", [(3, 16, 16), (8, 16, 16),
                                                         (4, 32, 16), (0, 16, 16)])
def test_a_stack_the_shape_cannot_take_is_refused(stack, block_n, block_size):
    batch = make_batch([1], [20], 8, 2, 64, block_size)
    with pytest.raises(ValueError, match="stack="):
        _run(batch, stack, 1, block_n)


# ---- CUDA, compiled, bf16 ----
GPU_CASES = {  # (heads, kv_heads, head_dim, block_size, seq_lens, stack, splits)
    "8b-stack4-direct": (32, 8, 128, 16, [1150, 1, 37, 4100, 16, 777], 4, 1),
    "8b-stack4-splits": (32, 8, 128, 16, [1150, 1, 37, 9000, 16, 777], 4, 7),
    "qwen3-stack2": (32, 4, 128, 16, [2048, 5, 300], 2, 5),
}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
@pytest.mark.parametrize("case", GPU_CASES.values(), ids=GPU_CASES.keys())
def test_gpu_stacked(case, dtype):
    heads, kv_heads, d, bs, lens, stack, splits = case
    batch = make_batch([1] * len(lens), lens, heads, kv_heads, d, bs, pad=2,
                       dtype=torch.bfloat16, device="cuda")
    if dtype == torch.bfloat16:
        _, ref = reference(batch, d ** -0.5)
    else:  # over the 8-bit values the cache holds, the new ones as torch rounds them
        batch.kv_cache = batch.kv_cache.to(dtype)
        _, ref = fp8_reference(batch, dtype, d ** -0.5)
    write_kv_cache(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    n = len(lens)
    out = _run(batch, stack, splits, STACK_BLOCK_N)
    torch.testing.assert_close(out[:n].float(), ref[:n], atol=2e-2, rtol=2e-2)
    assert bool(out[n:].isnan().all())
    plain = _run(batch, 1, splits, STACK_BLOCK_N)
    torch.testing.assert_close(out[:n].float(), plain[:n].float(), atol=1e-2, rtol=1e-2)
