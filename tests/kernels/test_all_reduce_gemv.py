"""The GEMV that all-reduces its own input (`add_rms_norm_gemv(..., exchange=, site=)`),
two ranks simulated in one process over buffers of one device: each rank's call against
NCCL-free references (the partial rows summed by torch, loom's fused_add_rms_norm, the
product in float64), both ranks' outputs equal bit for bit, the flags left as the protocol
says (a site's signals taken back by the call that consumed them).

On the CPU the interpreter runs one launch at a time, and a rank's call waits for its peer's
push: so rank 1's push into rank 0's area is made by the test before rank 0's call (as rank
1's own call would have, a moment earlier), then rank 0's call (which pushes into rank 1's
area), then rank 1's. With CUDA the two ranks' calls also run at once on two streams of
one GPU, replayed many times (tests/distributed has the 2-GPU run)."""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels import gemv as gemv_mod  # noqa: E402
from loom.kernels.all_reduce_gemv import GemvExchange  # noqa: E402
from loom.kernels.gemv import MAX_M, GemvConfig, add_rms_norm_gemv  # noqa: E402
from loom.layers.norm import fused_add_rms_norm  # noqa: E402
from tests.kernels.test_gemv_kernel import _interpreter_bf16_dot  # noqa: E402,F401  (autouse)
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

INTERPRET = isinstance(gemv_mod._gemv_kernel, InterpretedFunction)
DEVICE = "cpu" if INTERPRET else "cuda"
WIDTH, SITES = 96, 3


class Pair:
    """Two ranks' exchanges over plain tensors: data and flags per rank."""

    def __init__(self, dtype):
        elems = GemvExchange.data_elems(2, WIDTH, SITES)
        self.data = [torch.full((elems,), float("nan"), dtype=dtype, device=DEVICE)
                     for _ in range(2)]
        self.flags = [torch.zeros(SITES, dtype=torch.int32, device=DEVICE) for _ in range(2)]
        data_ptrs = torch.tensor([d.data_ptr() for d in self.data], device=DEVICE)
        flag_ptrs = torch.tensor([f.data_ptr() for f in self.flags], device=DEVICE)
        self.ranks = [GemvExchange(r, 2, data_ptrs, flag_ptrs, dtype, WIDTH, SITES)
                      for r in range(2)]

    def push_as(self, rank, x, site):
        """What rank's call does first: its rows into its slot of the peer's area, then
        the peer's flag."""
        peer = 1 - rank
        slot = MAX_M * WIDTH
        start = site * 2 * slot + rank * slot
        self.data[peer][start:start + x.numel()] = x.reshape(-1)
        self.flags[peer][site] += 1


def _case(m, k, n, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    parts = [torch.randn(m, k, generator=gen) for _ in range(2)]
    residual = torch.randn(m, k, generator=gen)
    norm_w = 1 + 0.1 * torch.randn(k, generator=gen)
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    return [t.to(dtype).to(DEVICE) for t in (*parts, residual, norm_w, w)]


def _reference(parts, residual, norm_w, w, eps):
    reduced = (parts[0].cpu().float() + parts[1].cpu().float()).to(parts[0].dtype)
    normed, res = fused_add_rms_norm(reduced, residual.cpu(), norm_w.cpu(), eps)
    return normed.double() @ w.cpu().double().T, res


def _rel(got, want):
    return ((got.cpu().double() - want).norm() / want.norm()).item()


CONFIGS = [GemvConfig(block_n=16, block_k=32), GemvConfig(block_n=16, block_k=16, use_dot=True)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.describe().replace(" ", "_"))
@pytest.mark.parametrize("m, k", [(1, 64), (3, 96), (2, 80)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_both_ranks_get_the_all_reduced_norm_product(cfg, m, k, dtype):
    eps, site = 1e-5, 1
    x0, x1, residual, norm_w, w = _case(m, k, 40, dtype, seed=m * 100 + k)
    pair = Pair(dtype)
    pair.push_as(1, x1, site)
    y0, r0 = add_rms_norm_gemv(x0, residual, norm_w, eps, w, config=cfg,
                               exchange=pair.ranks[0], site=site)
    assert pair.flags[0].tolist() == [0, 0, 0], "rank 0 took rank 1's signal back"
    assert pair.flags[1].tolist() == [0, 1, 0], "rank 0 signalled rank 1 at its site"
    y1, r1 = add_rms_norm_gemv(x1, residual, norm_w, eps, w, config=cfg,
                               exchange=pair.ranks[1], site=site)
    assert pair.flags[1].tolist() == [0, 0, 0]
    assert pair.flags[0].tolist() == [0, 1, 0]  # rank 1's push for rank 0's next call
    assert torch.equal(y0, y1) and torch.equal(r0, r1), "the ranks disagree"
    assert all(not ex.local.any() for ex in pair.ranks), "a go word or counter left set"
    want, want_res = _reference([x0, x1], residual, norm_w, w, eps)
    if dtype == torch.float32:
        torch.testing.assert_close(r0.cpu(), want_res, rtol=0, atol=0)
        assert _rel(y0, want) < 1e-5
    else:  # the interpreter truncates float32 -> bfloat16 where torch rounds
        torch.testing.assert_close(r0.cpu(), want_res, rtol=2 ** -7, atol=2e-2)
        assert _rel(y0, want) < 1.5e-2


def test_each_site_has_its_own_area_and_flag():
    """Two sites in flight at once (rank 1 pushed both before rank 0 consumed either):
    each call reads its own site's rows."""
    dtype = torch.float32
    pair = Pair(dtype)
    a = _case(1, 64, 32, dtype, seed=1)
    b = _case(1, 64, 32, dtype, seed=2)
    pair.push_as(1, a[1], 0)
    pair.push_as(1, b[1], 2)
    for (x0, x1, residual, norm_w, w), site in ((a, 0), (b, 2)):
        y0, _ = add_rms_norm_gemv(x0, residual, norm_w, 1e-5, w, exchange=pair.ranks[0],
                                  site=site, config=CONFIGS[0])
        want, _ = _reference([x0, x1], residual, norm_w, w, 1e-5)
        assert _rel(y0, want) < 1e-5
    assert pair.flags[0].tolist() == [0, 0, 0] and pair.flags[1].tolist() == [1, 0, 1]


def test_sites_are_handed_out_by_weight_in_call_order_until_none_is_left():
    pair = Pair(torch.float32)
    exchange = pair.ranks[0]
    weights = [torch.zeros(4, 4) for _ in range(SITES + 1)]
    assert [exchange.site(w) for w in weights[:SITES]] == list(range(SITES))
    assert exchange.site(weights[1]) == 1  # the same weight, the same site
    assert exchange.site(weights[SITES]) is None  # none left: the caller falls back


@pytest.mark.parametrize("case, match", [
    ("rows", "x must have 1 to 8 rows"), ("width", r"x must be \[1..8"),
    ("dtype", r"x must be \[1..8"), ("site", "site 3 out of range"),
])
def test_value_errors(case, match):
    dtype = torch.bfloat16 if case == "dtype" else torch.float32
    pair = Pair(torch.float32)
    m, k = (9, 64) if case == "rows" else ((1, 128) if case == "width" else (1, 64))
    x0, _, residual, norm_w, w = _case(m, k, 16, dtype, seed=3)
    with pytest.raises(ValueError, match=match):
        add_rms_norm_gemv(x0, residual, norm_w, 1e-5, w, exchange=pair.ranks[0],
                          site=SITES if case == "site" else 0)


@pytest.mark.skipif(INTERPRET, reason="two ranks at once need two CUDA streams")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_two_streams_at_once_replayed(dtype):
    """Both ranks' calls launched together on two streams of one GPU, every site in turn,
    many rounds, then captured in one CUDA graph per rank and replayed: each round's
    outputs equal the reference's and each other's, and every flag ends at 0. (One GPU
    holds both ranks' programs here: the grids are a few programs each.)"""
    pair = Pair(dtype)
    cases = [_case(2, 64, 256, dtype, seed=10 + s) for s in range(SITES)]
    refs = [_reference([c[0], c[1]], c[2], c[3], c[4], 1e-5)[0] for c in cases]
    streams = [torch.cuda.Stream() for _ in range(2)]
    cfg = CONFIGS[0]
    # One shape at every site: one binary, compiled and loaded by a call in turn first
    # (rank 1's push made by hand). Loading a module while the other rank's kernel spins
    # would wait for that kernel, which waits for the load's caller.
    x0, x1, residual, norm_w, w = cases[0]
    pair.push_as(1, x1, 0)
    add_rms_norm_gemv(x0, residual, norm_w, 1e-5, w, config=cfg, exchange=pair.ranks[0], site=0)
    add_rms_norm_gemv(x1, residual, norm_w, 1e-5, w, config=cfg, exchange=pair.ranks[1], site=0)
    torch.cuda.synchronize()
    pair.flags[0].zero_()  # rank 1's push for a call of rank 0 that the test will not make

    def run_rank(rank):
        outs = []
        for site, (x0, x1, residual, norm_w, w) in enumerate(cases):
            x = x0 if rank == 0 else x1
            outs.append(add_rms_norm_gemv(x, residual, norm_w, 1e-5, w, config=cfg,
                                          exchange=pair.ranks[rank], site=site)[0])
        return outs

    torch.cuda.synchronize()
    for _ in range(20):
        results = []
        for rank in range(2):
            with torch.cuda.stream(streams[rank]):
                results.append(run_rank(rank))
        torch.cuda.synchronize()
        for site in range(SITES):
            assert torch.equal(results[0][site], results[1][site])
            assert _rel(results[0][site], refs[site]) < (1e-5 if dtype == torch.float32
                                                          else 1.5e-2)
    assert all(f.sum().item() == 0 for f in pair.flags)
    graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
    captured = []
    for rank in range(2):  # capture runs nothing: no push waits on the other rank
        with torch.cuda.graph(graphs[rank], stream=streams[rank]):
            captured.append(run_rank(rank))
    for _ in range(20):
        for rank in range(2):
            with torch.cuda.stream(streams[rank]):
                graphs[rank].replay()
        torch.cuda.synchronize()
        for site in range(SITES):
            assert torch.equal(captured[0][site], captured[1][site])
            assert _rel(captured[0][site], refs[site]) < (1e-5 if dtype == torch.float32
                                                           else 1.5e-2)
    assert all(f.sum().item() == 0 for f in pair.flags)


_OFFLINE_COMPILE = r"""
import os
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.gemv import _gemv_kernel
names = list(_gemv_kernel.arg_names)
pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "part_ptr": "*fp32",
            "count_ptr": "*i32", "res_ptr": "*bf16", "nw_ptr": "*bf16", "res_out_ptr": "*bf16",
            "ar_data_ptrs": "*i64", "ar_flag_ptrs": "*i64", "ar_local_ptr": "*i32"}
for cons, warps, stages in [
        # one TP=2 rank's qkv and gate_up at batch 1 (the H200 gemv_norm table's tiles)
        (dict(M=1, K=4096, BLOCK_N=8, BLOCK_K=1024, USE_DOT=False), 4, 3),
        (dict(M=1, K=4096, BLOCK_N=16, BLOCK_K=256, USE_DOT=False, PREFETCH_BYTES=512), 4, 1),
        (dict(M=2, K=4096, BLOCK_N=32, BLOCK_K=256, USE_DOT=True), 4, 4)]:
    cons.setdefault("PREFETCH_BYTES", 0)
    cons.update(PDL=False, SPLIT_K=1, SPLIT_MODE=0, SILU_MUL=False, ADD_NORM=True, EVEN_N=True,
                DOT_PRECISION="tf32", NUM_STAGES=stages, AR_WORLD=2, AR_SLOT=8 * 4096,
                AR_SITE_STRIDE=2 * 8 * 4096)
    sig = dict(pointers, eps="fp32", N="i32", ar_rank="i32", ar_site="i32", ar_area_delta="i64",
               **{k: "constexpr" for k in cons})
    src = ASTSource(fn=_gemv_kernel, signature=sig,
                    constexprs={(names.index(k),): v for k, v in cons.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in range(6)})
    kernel = tcompile(src, target=GPUTarget("cuda", 90, 32),
                      options=dict(num_warps=warps, num_stages=stages))
    ptx = kernel.asm["ptx"]
    assert kernel.asm["cubin"], "no cubin"
    syncs = [line for line in ptx.splitlines() if ".sys" in line]
    assert any("release" in line for line in syncs), "the signal is not a release"
    assert any("acquire" in line for line in syncs), "the wait is not an acquire"
    print("ok", cons["M"], cons["USE_DOT"], "cp.async" in ptx)
"""


def test_compiles_for_sm90_offline():
    """The compiled all-reducing GEMV, which the interpreter never exercises, builds for
    Hopper with Triton's bundled ptxas; its signal is a release and its wait an acquire,
    at system scope."""
    from tests.triton_interpreter import compile_for_sm90_offline
    out = compile_for_sm90_offline(_OFFLINE_COMPILE)
    assert out.count("ok") == 3, out


def test_the_decode_op_takes_the_exchange_where_a_norm_config_exists(monkeypatch):
    """`loom.decode_all_reduce_add_rms_norm_linear` with the group's exchange and a
    gemv_norm config: one call of the all-reducing GEMV at the weight's site (sites handed
    out by weight in call order), the reference's output."""
    import loom.kernels.gemv_decode as gemv_decode
    from loom.distributed import ops
    pair = Pair(torch.float32)
    monkeypatch.setitem(ops._GEMV_EXCHANGES, "tp", pair.ranks[0])
    monkeypatch.setattr(gemv_decode, "norm_config", lambda m, n, k, dtype, device: CONFIGS[0])
    calls = []
    real = gemv_decode.add_rms_norm_gemv

    def spy(*args, **kwargs):
        calls.append(kwargs["site"])
        return real(*args, **kwargs)

    monkeypatch.setattr(gemv_decode, "add_rms_norm_gemv", spy)
    first = _case(1, 64, 32, torch.float32, seed=5)
    second = _case(1, 64, 32, torch.float32, seed=6)
    for (x0, x1, residual, norm_w, w), site in ((first, 0), (second, 1)):
        pair.push_as(1, x1, site)
        y, res = torch.ops.loom.decode_all_reduce_add_rms_norm_linear(
            x0, residual, norm_w, 1e-5, w, "tp")
        want, want_res = _reference([x0, x1], residual, norm_w, w, 1e-5)
        assert _rel(y, want) < 1e-5
        torch.testing.assert_close(res.cpu(), want_res, rtol=0, atol=0)
    assert calls == [0, 1]
