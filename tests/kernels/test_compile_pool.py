"""loom/kernels/compile_pool.py and paged_decode's compile_only: kernels compiled side by
side on threads, nothing launched, and the later real launch compiles nothing (`-m gpu`)."""

import sys

import pytest
import torch

from tests.kernels.test_paged_attention import (INTERPRET, make_batch,  # noqa: E402
                                                needs_gpu, reference)

from loom.kernels import jit_watch  # noqa: E402
from loom.kernels.compile_pool import compile_pool  # noqa: E402
from loom.kernels.kv_write import write_kv_cache  # noqa: E402
from loom.kernels.paged_decode import paged_decode  # noqa: E402


def test_the_pool_has_threads_and_says_0_without_async_compiles(monkeypatch):
    with compile_pool(3) as threads:
        assert 1 <= threads <= 3
    monkeypatch.setitem(sys.modules, "triton.runtime._async_compile", None)  # ImportError
    with compile_pool(3) as threads:
        assert threads == 0


def _decode(batch, out, compile_only):
    m = batch.meta
    req_index = torch.arange(m.num_reqs, dtype=torch.int32, device=out.device)
    # num_warps 2: a variant no other test compiles, so the first compile is this one's
    paged_decode(batch.query, batch.kv_cache, out, m.block_table, m.query_start_loc,
                 m.seq_lens, m.num_reqs, batch.query.shape[-1] ** -0.5, 3, 32, num_warps=2,
                 num_stages=3, req_index=req_index, compile_only=compile_only)


@pytest.mark.skipif(not INTERPRET, reason="CPU checks need TRITON_INTERPRET=1")
def test_compile_only_runs_nothing():
    batch = make_batch([1, 1], [40, 9], 4, 2, 32, 16)
    write_kv_cache(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    out = torch.full_like(batch.query, float("nan"))
    with compile_pool():
        _decode(batch, out, compile_only=True)
    assert bool(out.isnan().all())
    _decode(batch, out, compile_only=False)  # the same call, run: the reference's output
    torch.testing.assert_close(out, reference(batch, batch.query.shape[-1] ** -0.5)[1],
                               atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@needs_gpu
def test_compiled_on_threads_then_launched_without_a_compile(monkeypatch):
    monkeypatch.setattr(jit_watch, "_events", [])
    batch = make_batch([1, 1, 1], [300, 9, 77], 8, 2, 64, 16, dtype=torch.bfloat16,
                       device="cuda")
    write_kv_cache(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    out = torch.full_like(batch.query, float("nan"))
    jit_watch.arm()
    try:
        with compile_pool() as threads:
            _decode(batch, out, compile_only=True)
        torch.cuda.synchronize()
        compiled = [name for name, _ in jit_watch.compiles()]
        assert threads >= 1 and "_decode_split_kernel" in compiled
        assert bool(out.isnan().all()), "compile_only launched a kernel"
        _decode(batch, out, compile_only=False)
        torch.cuda.synchronize()
        assert [name for name, _ in jit_watch.compiles()] == compiled
    finally:
        jit_watch.disarm()
    ref = reference(batch, batch.query.shape[-1] ** -0.5)[1]
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@needs_gpu
def test_gemv_compiled_on_threads_then_launched_without_a_compile(monkeypatch):
    """As the warm-up compiles the LM head's GEMV: compile_only on the pool, then the real
    call at the same shapes compiles nothing and matches cuBLAS."""
    from loom.kernels.gemv import GemvConfig, gemv
    monkeypatch.setattr(jit_watch, "_events", [])
    # A variant no other test compiles (one warp, five stages), split-K by the reduce kernel
    # (which an earlier test may have compiled already).
    cfg = GemvConfig(block_n=32, block_k=64, num_warps=1, num_stages=5, split_k=2,
                     split_mode="reduce")
    x = torch.randn(5, 512, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(320, 512, dtype=torch.bfloat16, device="cuda")
    jit_watch.arm()
    try:
        with compile_pool() as threads:
            gemv(x, w, config=cfg, compile_only=True)
        torch.cuda.synchronize()
        compiled = [name for name, _ in jit_watch.compiles()]
        assert threads >= 1 and "_gemv_kernel" in compiled
        y = gemv(x, w, config=cfg)
        torch.cuda.synchronize()
        assert [name for name, _ in jit_watch.compiles()] == compiled
    finally:
        jit_watch.disarm()
    torch.testing.assert_close(y.float(), (x.float() @ w.float().T), atol=0.5, rtol=2e-2)
