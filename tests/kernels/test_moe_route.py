"""The one-kernel softmax top-k routing against loom.layers.moe.route (torch's softmax and
topk) on random router logits; Triton's interpreter on the CPU, compiled on CUDA."""

import os

import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest  # noqa: E402

pytest.importorskip("triton")
from loom.kernels.moe_route import route_topk  # noqa: E402
from loom.layers.moe import route  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("tokens, experts, top_k", [
    (1, 128, 8),    # Qwen3-30B-A3B at batch-1 decode
    (37, 128, 8),
    (5, 60, 6),     # neither a power of two
    (4, 8, 2),      # Mixtral's routing
    (3, 16, 16),    # every expert
])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_topk_matches_torch(tokens, experts, top_k, renormalize, dtype):
    logits = (torch.randn(tokens, experts, device=DEVICE) * 3).to(dtype)
    weights, ids = route_topk(logits, top_k, renormalize)
    want_weights, want_ids = route(logits, top_k, renormalize)
    assert ids.dtype == want_ids.dtype and weights.dtype == want_weights.dtype
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    if dtype == torch.float32:  # no ties: the same experts in the same order
        assert torch.equal(ids, want_ids)
    else:
        # bf16 logits repeat, and torch orders equal ones its own way: each chosen expert's
        # probability must be the one torch ranks in that place
        probs = torch.softmax(logits.float(), dim=-1)
        assert all(len(set(row)) == top_k for row in ids.tolist())
        torch.testing.assert_close(probs.gather(1, ids), probs.topk(top_k, dim=-1).values,
                                   atol=0, rtol=0)


def test_route_topk_reads_a_strided_view_and_breaks_ties_low():
    # the router's logits as a column slice of a wider tensor; a row of equal logits
    wide = torch.randn(3, 40, device=DEVICE)
    wide[1] = 0.5
    weights, ids = route_topk(wide[:, 4:36], 4, True)
    want_weights, want_ids = route(wide[:, 4:36], 4, True)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    assert torch.equal(ids[[0, 2]], want_ids[[0, 2]])
    assert ids[1].tolist() == [0, 1, 2, 3]  # the lowest index wins a tie
    assert weights[1].tolist() == [0.25] * 4


def test_route_topk_bad_top_k():
    with pytest.raises(ValueError, match="top_k must be in 1..8"):
        route_topk(torch.randn(2, 8, device=DEVICE), 9, True)


def _router_inputs(tokens, experts, hidden, dtype):
    x = torch.randn(tokens, hidden, device=DEVICE).to(dtype)
    weight = (torch.randn(experts, hidden, device=DEVICE) / hidden ** 0.5 * 3).to(dtype)
    return x, weight


@pytest.mark.parametrize("tokens, experts, hidden, top_k, block_n, block_k", [
    (1, 128, 256, 8, 8, 64),    # Qwen3-30B-A3B's routing (hidden cut down): 16 programs
    (3, 60, 100, 6, 16, 32),    # neither a power of two; K chunks that do not divide
    (8, 16, 64, 16, 4, 64),     # every expert, the most tokens the GEMV takes
    (5, 8, 48, 2, 8, 16),       # Mixtral's routing, one program
])
@pytest.mark.parametrize("renormalize", [True, False])
def test_router_topk_matches_linear_then_route(tokens, experts, hidden, top_k, block_n,
                                               block_k, renormalize):
    """The GEMV whose last program routes: the logits torch's linear gives (float32, so no
    ties), then loom.layers.moe.route's experts and weights. Called twice with fresh inputs:
    the last program must leave its counter ready for the next launch."""
    from loom.kernels.gemv import GemvConfig
    from loom.kernels.moe_route import router_topk
    cfg = GemvConfig(block_n=block_n, block_k=block_k, num_warps=4, num_stages=2)
    for _ in range(2):
        x, weight = _router_inputs(tokens, experts, hidden, torch.float32)
        weights, ids = router_topk(x, weight, top_k, renormalize, config=cfg)
        want_weights, want_ids = route(torch.nn.functional.linear(x, weight), top_k,
                                       renormalize)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("tokens, table_rows", [(11, "8"), (2, None), (5, "4")])
def test_router_topk_off_its_table_takes_linear_then_route(tokens, table_rows, tmp_path,
                                                          monkeypatch):
    """Past the GEMV's 8 rows, where the router table has no file, or no row count at or
    above the batch's: the decode linear then the route kernel, never the fused launch.
    Within its rows the table's config is taken."""
    import json

    from loom.kernels import gemv_decode, moe_route
    if table_rows:
        table = {"16,32": {table_rows: {"block_n": 4, "block_k": 16, "num_warps": 1,
                                        "num_stages": 1}}}
        name = f"router_topk,dtype=float32,device_name={DEVICE}.json"
        (tmp_path / name).write_text(json.dumps(table))
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    gemv_decode._table.cache_clear()
    launches = []
    real = moe_route._router_topk_kernel
    monkeypatch.setattr(moe_route, "_router_topk_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: launches.append(grid) or real[grid]})())
    try:
        x, weight = _router_inputs(tokens, 16, 32, torch.float32)
        weights, ids = moe_route.router_topk(x, weight, 4, True)
        want_weights, want_ids = route(torch.nn.functional.linear(x, weight), 4, True)
        assert torch.equal(ids, want_ids)
        torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
        assert launches == []
        if table_rows == "4":  # 3 rows take the config measured at 4: 16 experts in 4 blocks
            moe_route.router_topk(x[:3], weight, 4, True)
            assert launches == [(4,)]
    finally:
        gemv_decode._table.cache_clear()


def test_router_topk_bad_arguments():
    from loom.kernels.moe_route import router_topk
    x, weight = _router_inputs(2, 8, 32, torch.float32)
    with pytest.raises(ValueError, match="top_k must be in 1..8"):
        router_topk(x, weight, 9, True)
    with pytest.raises(ValueError, match=r"weight must be \[E, 32\]"):
        router_topk(x, weight[:, :16], 2, True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1, 2, 3, 8])
def test_gpu_router_topk_bf16_qwen3_shape(tokens):
    """bf16 at Qwen3-30B-A3B's router shape (128 experts over 2048): the logits may differ
    from cuBLAS's by an ulp of bf16, so each chosen expert's probability (from cuBLAS's
    logits) must be within that of the one torch ranks in its place."""
    from loom.kernels.moe_route import router_topk
    x, weight = _router_inputs(tokens, 128, 2048, torch.bfloat16)
    weights, ids = router_topk(x, weight, 8, True)
    probs = torch.softmax(torch.nn.functional.linear(x, weight).float(), dim=-1)
    assert all(len(set(row)) == 8 for row in ids.tolist())
    torch.testing.assert_close(probs.gather(1, ids), probs.topk(8, dim=-1).values,
                               atol=0, rtol=2e-2)
    want_weights, _ = route(torch.nn.functional.linear(x, weight), 8, True)
    torch.testing.assert_close(weights, want_weights, atol=2e-3, rtol=2e-2)


_ROUTER_OFFLINE_COMPILE = r"""
import os
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.moe_route import _router_topk_kernel
pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "logits_ptr": "*bf16", "weights_ptr": "*fp32",
            "ids_ptr": "*i64", "count_ptr": "*i32"}
# Qwen3-30B-A3B's router at 1 and 3 tokens, with the GEMV table's tiles for its shape
for m, block_n, block_k, warps, stages in ((1, 8, 1024, 8, 1), (3, 8, 256, 4, 3)):
    cons = dict(M=m, M_PAD=1 << (m - 1).bit_length(), K=2048, E=128, EXPERTS_PAD=128,
                BLOCK_N=block_n, BLOCK_K=block_k, NUM_STAGES=stages, TOP_K=8, TOP_K_PAD=8,
                RENORMALIZE=True)
    names = list(_router_topk_kernel.arg_names)
    sig = {n: "constexpr" if n in cons else pointers[n] for n in names}
    src = ASTSource(fn=_router_topk_kernel, signature=sig,
                    constexprs={(names.index(k),): v for k, v in cons.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                           if sig[n] != "constexpr"})
    kernel = tcompile(src, target=GPUTarget("cuda", 90, 32),
                      options=dict(num_warps=warps, num_stages=stages))
    assert kernel.asm["cubin"]
    print("ok")
"""


def test_router_topk_kernel_compiles_for_sm90_offline():
    """The atomic semaphore and the last program's routing, which only the interpreter runs
    here, build for Hopper."""
    from tests.triton_interpreter import compile_for_sm90_offline
    assert compile_for_sm90_offline(_ROUTER_OFFLINE_COMPILE).count("ok") == 2
