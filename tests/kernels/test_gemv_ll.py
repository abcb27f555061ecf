"""TP decode's all-reduce inside the GEMVs on either side of it (kernels/gemv.py, LL):
a row-parallel GEMV pushes its outputs to the peer as LL words (`gemv_ll_push`), and the
next add + norm GEMV sums the ranks' partials itself (`add_rms_norm_gemv(..., ll=)`).

Two ranks simulated in one process over buffers of one device, as
tests/kernels/test_all_reduce_norm_ll.py does: on the CPU the interpreter runs one launch
at a time, so both producers run before both consumers. References nobody here wrote: torch's
sum of the two partials rounded to the dtype (the all-reduce's output), then torch's add,
RMSNorm and product; and loom's own add + norm GEMV fed that sum, bit for bit. With CUDA
the two ranks also run at once on two streams, eagerly and replayed from CUDA graphs."""

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels import gemv as gemv_mod  # noqa: E402
from loom.kernels.all_reduce_norm_ll import LowLatencyNormBuffer  # noqa: E402
from loom.kernels.gemv import (GemvConfig, add_rms_norm_gemv, gemv,  # noqa: E402
                               gemv_ll_push)
from tests.kernels.test_gemv_kernel import _interpreter_bf16_dot, rel_err  # noqa: E402,F401
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

INTERPRET = isinstance(gemv_mod._gemv_kernel, InterpretedFunction)
DEVICE = "cpu" if INTERPRET else "cuda"
MAX_ROWS, MAX_WIDTH = 4, 256
HIDDEN, SHARD, OUT = 256, 64, 32  # the residual's width, a rank's input shard, qkv's shard

PUSH = [GemvConfig(block_n=16, block_k=32),
        GemvConfig(block_n=32, block_k=16, split_k=2, split_mode="fixup")]
SUM = [GemvConfig(block_n=16, block_k=64), GemvConfig(block_n=16, block_k=32, use_dot=True)]


class Pair:
    def __init__(self):
        words = LowLatencyNormBuffer.words(2, MAX_ROWS, MAX_WIDTH)
        self.bufs = [torch.zeros(words, dtype=torch.int64, device=DEVICE) for _ in range(2)]
        ptrs = torch.tensor([b.data_ptr() for b in self.bufs], device=DEVICE)
        self.ranks = [LowLatencyNormBuffer(r, 2, ptrs, MAX_ROWS, MAX_WIDTH) for r in range(2)]


def _case(rows, dtype, seed):
    """Each rank's input shard and row-parallel weight, the residual, the norm weight and
    each rank's consumer weight."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(dtype).to(DEVICE)
    return dict(a=[r(rows, SHARD) for _ in range(2)],
                w_row=[r(HIDDEN, SHARD, scale=SHARD ** -0.5) for _ in range(2)],
                residual=r(rows, HIDDEN), norm_w=(1 + 0.1 * torch.randn(HIDDEN, generator=gen))
                .to(dtype).to(DEVICE), w_col=[r(OUT, HIDDEN, scale=HIDDEN ** -0.5)
                                              for _ in range(2)])


def _run_rank(pair, rank, c, push_cfg, sum_cfg, stage):
    """stage "push": the producer; "sum": the consumer (after the producer's call)."""
    ll = pair.ranks[rank]
    if stage == "push":
        return gemv_ll_push(c["a"][rank], c["w_row"][rank], ll, config=push_cfg)
    return add_rms_norm_gemv(c["partial"][rank], c["residual"], c["norm_w"], 1e-5,
                             c["w_col"][rank], config=sum_cfg, ll=ll)


def _as_kernel_rounds(t, dtype):
    """float32 t to dtype as the kernel rounds it: to nearest, but the interpreter
    truncates float32 -> bfloat16."""
    if INTERPRET and dtype == torch.bfloat16:
        return (t.view(torch.int32) & -65536).view(torch.float32).to(dtype)
    return t.to(dtype)


def _torch_reference(c, rank, dtype):
    partial = [(c["a"][r].cpu().float() @ c["w_row"][r].cpu().float().T).to(dtype)
               for r in range(2)]
    reduced = _as_kernel_rounds(c["partial"][0].cpu().float() + c["partial"][1].cpu().float(),
                                dtype)
    h = ((partial[0].float() + partial[1].float()).to(dtype).float()
         + c["residual"].cpu().float()).to(dtype)
    normed = F.rms_norm(h.float(), (HIDDEN,), c["norm_w"].cpu().float(), 1e-5)
    return normed @ c["w_col"][rank].cpu().float().T, h, reduced


def _check(c, outs, sum_cfg, dtype):
    (y0, res0), (y1, res1) = outs
    assert torch.equal(res0, res1), "both ranks hold the same residual, bit for bit"
    for rank, (y, res) in enumerate(outs):
        want_y, want_h, reduced = _torch_reference(c, rank, dtype)
        # loom's add + norm GEMV fed the all-reduced rows: the same kernel, the same bits
        same_y, same_res = add_rms_norm_gemv(reduced.to(DEVICE), c["residual"], c["norm_w"],
                                             1e-5, c["w_col"][rank], config=sum_cfg)
        assert torch.equal(res, same_res) and torch.equal(y, same_y), f"rank {rank}"
        # against torch: a few roundings of the dtype apart (the partials' sums run in
        # another order), measured against the rows' largest value
        for got, want in ((res, want_h), (y, want_y)):
            norm, worst = rel_err(got, want)
            assert norm < 1.5e-2 and worst < 3e-2, (rank, norm, worst)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("push_cfg, sum_cfg", list(zip(PUSH, SUM)),
                         ids=["plain-rows", "fixup-dot"])
def test_calls_in_a_row_match_the_references(dtype, push_cfg, sum_cfg):
    pair = Pair()
    for epoch, rows in enumerate([1, 3, MAX_ROWS, 1], start=1):
        c = _case(rows, dtype, seed=epoch)
        c["partial"] = [_run_rank(pair, r, c, push_cfg, sum_cfg, "push") for r in range(2)]
        for r in range(2):  # the producer's own partial is the plain GEMV's, bit for bit
            assert torch.equal(c["partial"][r], gemv(c["a"][r], c["w_row"][r],
                                                     config=push_cfg))
            assert pair.ranks[r].state.tolist() == [epoch - 1, 0], "producers keep the epoch"
        outs = [_run_rank(pair, r, c, push_cfg, sum_cfg, "sum") for r in range(2)]
        _check(c, outs, sum_cfg, dtype)
        for r in pair.ranks:
            assert r.state.tolist() == [epoch, 0], "the consumer ends the call's epoch"


@pytest.mark.parametrize("case, match", [
    ("float32", "16-bit values"), ("rows", "do not fit the LL buffer"),
    ("width", "do not fit the LL buffer"), ("reduce split", "no split but 'fixup'")])
def test_what_it_does_not_take(case, match):
    pair = Pair()
    dtype = torch.float32 if case == "float32" else torch.bfloat16
    rows = MAX_ROWS + 1 if case == "rows" else 1
    x = torch.randn(rows, SHARD).to(dtype).to(DEVICE)
    w = torch.randn(MAX_WIDTH + 2 if case == "width" else HIDDEN, SHARD).to(dtype).to(DEVICE)
    cfg = GemvConfig(block_k=16, split_k=2, split_mode="reduce") if case == "reduce split" \
        else None
    with pytest.raises(ValueError, match=match):
        gemv_ll_push(x, w, pair.ranks[0], config=cfg)
    if case in ("float32", "rows"):
        h = torch.randn(rows, HIDDEN).to(dtype).to(DEVICE)
        with pytest.raises(ValueError, match=match):
            add_rms_norm_gemv(h, h, h[0].contiguous(), 1e-5, w[:OUT, :1].expand(OUT, HIDDEN)
                              .contiguous(), ll=pair.ranks[0])


@pytest.mark.skipif(INTERPRET, reason="two ranks at once need two CUDA streams")
def test_two_streams_at_once_eager_and_replayed():
    """Both ranks' producer + consumer at once on two streams of one GPU, 20 rounds of 4
    pairs, then a captured CUDA graph per rank replayed 20 times; every call equals the
    references."""
    pair = Pair()
    dtype = torch.bfloat16
    cases = [_case(1 + i % MAX_ROWS, dtype, seed=30 + i) for i in range(4)]
    streams = [torch.cuda.Stream() for _ in range(2)]
    # Every case's kernels (M is a constexpr) compiled and loaded by calls in turn first:
    # a module load while the other rank's kernel spins would wait for that kernel.
    for c in cases:
        c["partial"] = [_run_rank(pair, r, c, PUSH[0], SUM[0], "push") for r in range(2)]
        for r in range(2):
            _run_rank(pair, r, c, PUSH[0], SUM[0], "sum")
    torch.cuda.synchronize()

    def run(rank):
        outs = []
        for c in cases:
            partial = _run_rank(pair, rank, c, PUSH[0], SUM[0], "push")
            outs.append((partial, add_rms_norm_gemv(partial, c["residual"], c["norm_w"], 1e-5,
                                                    c["w_col"][rank], config=SUM[0],
                                                    ll=pair.ranks[rank])))
        return outs

    def check(results):
        for i, c in enumerate(cases):
            c["partial"] = [results[r][i][0] for r in range(2)]
            _check(c, [results[r][i][1] for r in range(2)], SUM[0], dtype)

    for _ in range(20):
        results = [None, None]
        for rank in range(2):
            with torch.cuda.stream(streams[rank]):
                results[rank] = run(rank)
        torch.cuda.synchronize()
        check(results)
    graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
    captured = [None, None]
    for rank in range(2):
        with torch.cuda.graph(graphs[rank], stream=streams[rank]):
            captured[rank] = run(rank)
    for _ in range(20):
        for rank in range(2):
            with torch.cuda.stream(streams[rank]):
                graphs[rank].replay()
        torch.cuda.synchronize()
        check(captured)


_OFFLINE_COMPILE = r"""
import os
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.gemv import _gemv_kernel as fn
names = list(fn.arg_names)
pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "part_ptr": "*fp32",
            "count_ptr": "*i32", "res_ptr": "*bf16", "nw_ptr": "*bf16", "res_out_ptr": "*bf16",
            "ll_ptrs": "*i64", "state_ptr": "*i32", "own_ptr": "*bf16"}
common = dict(EVEN_N=True, DOT_PRECISION="tf32", PDL=False, PREFETCH_BYTES=0, SILU_MUL=False,
              USE_DOT=False, WORLD=2, LL_MAX_ROWS=64, LL_ROW_WORDS=8192, M=1, K=4096)
for cons in [
        # TP=2's o_proj: pushes from the fixup's last program
        dict(common, LL=1, BLOCK_N=16, BLOCK_K=512, SPLIT_K=4, SPLIT_MODE=1, ADD_NORM=False,
             LL_CHUNK=1, NUM_STAGES=3),
        # TP=2's qkv: sums the ranks' rows before its add + norm
        dict(common, LL=2, BLOCK_N=8, BLOCK_K=1024, SPLIT_K=1, SPLIT_MODE=0, ADD_NORM=True,
             LL_CHUNK=1024, NUM_STAGES=3)]:
    sig = {n: "constexpr" if n in cons else pointers.get(n, "fp32" if n == "eps" else "i32")
           for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v
                                                      for k, v in cons.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                           if sig[n].startswith("*")})
    kernel = tcompile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4,
                                                                          num_stages=3))
    ptx = kernel.asm["ptx"]
    assert kernel.asm["cubin"], "no cubin"
    assert "cp.async" in ptx, "the weight loop was not pipelined"
    if cons["LL"] == 2:
        assert "ld.volatile.global" in ptx, "the poll is not a volatile load"
    assert not any(f in ptx for f in ("fence.sc.sys", "membar.sys", ".release.sys")), "a fence"
    print("ok", cons["LL"])
"""


def test_compiles_for_sm90_offline_without_a_system_fence():
    """Both LL forms build for Hopper (the interpreter never exercises the compiled path):
    the weight loop still pipelined, the consumer's poll a volatile load, no system-scope
    fence."""
    from tests.triton_interpreter import compile_for_sm90_offline
    assert compile_for_sm90_offline(_OFFLINE_COMPILE).split() == ["ok", "1", "ok", "2"]
