"""The LL all-reduce + add + RMSNorm kernel (kernels/all_reduce_norm_ll.py), two ranks
simulated in one process over buffers of one device, against loom's add + norm of the
rows summed by torch (the all-reduce's rounding to the dtype first): both ranks bit for bit
alike, calls in a row (the epoch's two buffers alternating), every row count up to the
buffer's, float16 and bfloat16.

On the CPU the interpreter runs one launch at a time, and a rank's call waits for its
peer's words: the test writes rank 1's words into rank 0's buffer before rank 0's call (as
rank 1's call would have, a moment earlier), then runs rank 0's call, then rank 1's. With
CUDA the two ranks also run at once on two streams, eagerly and replayed from CUDA graphs
(tests/distributed/test_all_reduce_norm_gpu.py has the 2-GPU run)."""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels import all_reduce_norm_ll as ll_mod  # noqa: E402
from loom.kernels.all_reduce_norm_ll import LowLatencyNormBuffer  # noqa: E402
from loom.layers.norm import fused_add_rms_norm  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

INTERPRET = isinstance(ll_mod._ll_all_reduce_add_rms_norm_kernel, InterpretedFunction)
DEVICE = "cpu" if INTERPRET else "cuda"
MAX_ROWS, MAX_WIDTH = 4, 256


class Pair:
    def __init__(self):
        words = LowLatencyNormBuffer.words(2, MAX_ROWS, MAX_WIDTH)
        self.bufs = [torch.zeros(words, dtype=torch.int64, device=DEVICE) for _ in range(2)]
        ptrs = torch.tensor([b.data_ptr() for b in self.bufs], device=DEVICE)
        self.ranks = [LowLatencyNormBuffer(r, 2, ptrs, MAX_ROWS, MAX_WIDTH) for r in range(2)]

    def push_as(self, rank, x, epoch):
        """What `rank`'s call of that epoch does first: its rows' words into the peer's
        buffer (slot `rank` of the epoch's parity)."""
        peer, (rows, n) = 1 - rank, x.shape
        pairs = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        words = (epoch << 32) | pairs
        row_words = MAX_WIDTH // 2
        base = ((epoch & 1) * 2 + rank) * MAX_ROWS * row_words
        for r in range(rows):
            start = base + r * row_words
            self.bufs[peer][start:start + n // 2] = words[r]


def _case(rows, n, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x0, x1, residual = (torch.randn(rows, n, generator=gen) for _ in range(3))
    weight = 1 + 0.1 * torch.randn(n, generator=gen)
    return [t.to(dtype).to(DEVICE) for t in (x0, x1, residual, weight)]


def _reference(x0, x1, residual, weight):
    reduced = (x0.cpu().float() + x1.cpu().float()).to(x0.dtype)
    return fused_add_rms_norm(reduced, residual.cpu(), weight.cpu(), 1e-5)


def _close(got, want, dtype):
    if INTERPRET and dtype == torch.bfloat16:
        # The interpreter truncates float32 -> bfloat16 where torch and the GPU round.
        torch.testing.assert_close(got.cpu(), want, rtol=2 ** -6, atol=2e-2)
    else:  # the norm's sum runs in another order: the result may land one ulp apart
        torch.testing.assert_close(got.cpu(), want, rtol=2 ** -7 if dtype == torch.bfloat16
                                   else 2 ** -10, atol=1e-2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_calls_in_a_row_match_the_reference_on_both_ranks(dtype):
    pair = Pair()
    for epoch, (rows, n) in enumerate([(1, 256), (3, 64), (4, 100), (1, 256)], start=1):
        x0, x1, residual, weight = _case(rows, n, dtype, seed=epoch)
        pair.push_as(1, x1, epoch)
        out0, res0 = pair.ranks[0].all_reduce_add_rms_norm(x0, residual, weight, 1e-5)
        out1, res1 = pair.ranks[1].all_reduce_add_rms_norm(x1, residual, weight, 1e-5)
        assert torch.equal(out0, out1) and torch.equal(res0, res1), f"call {epoch}"
        want_out, want_res = _reference(x0, x1, residual, weight)
        _close(res0, want_res, dtype)
        _close(out0, want_out, dtype)
        for r in pair.ranks:
            assert r.state.tolist() == [epoch, 0], "the epoch is recorded, the count reset"


def test_the_epoch_skips_zero_after_its_last_value():
    pair = Pair()
    last = (1 << 31) - 1
    for r in pair.ranks:
        r.state[0] = last
    x0, x1, residual, weight = _case(1, 64, torch.bfloat16, seed=9)
    pair.push_as(1, x1, 1)
    pair.ranks[0].all_reduce_add_rms_norm(x0, residual, weight, 1e-5)
    assert pair.ranks[0].state.tolist() == [1, 0]


@pytest.mark.parametrize("case", ["float32", "odd width", "rows", "width"])
def test_what_it_does_not_take(case):
    pair = Pair()
    dtype = torch.float32 if case == "float32" else torch.bfloat16
    rows, n = {"odd width": (1, 63), "rows": (MAX_ROWS + 1, 64),
               "width": (1, MAX_WIDTH + 2)}.get(case, (1, 64))
    x0, _, residual, weight = _case(rows, n, dtype, seed=3)
    assert not pair.ranks[0].fits(x0, residual, weight)
    with pytest.raises(ValueError, match="LL all-reduce"):
        pair.ranks[0].all_reduce_add_rms_norm(x0, residual, weight, 1e-5)


@pytest.mark.skipif(INTERPRET, reason="two ranks at once need two CUDA streams")
def test_two_streams_at_once_eager_and_replayed():
    """Both ranks' calls at once on two streams of one GPU, 20 rounds of 5 calls, then a
    captured CUDA graph per rank replayed 20 times; every call equals the reference's and
    the ranks agree bit for bit."""
    pair = Pair()
    dtype = torch.bfloat16
    cases = [_case(1 + i % MAX_ROWS, 256, dtype, seed=20 + i) for i in range(5)]
    refs = [_reference(*c) for c in cases]
    streams = [torch.cuda.Stream() for _ in range(2)]
    # Compiled and loaded by a call in turn first: a module load while the other rank's
    # kernel spins would wait for that kernel.
    x0, x1, residual, weight = cases[0]
    pair.push_as(1, x1, 1)
    pair.ranks[0].all_reduce_add_rms_norm(x0, residual, weight, 1e-5)
    pair.ranks[1].all_reduce_add_rms_norm(x1, residual, weight, 1e-5)
    torch.cuda.synchronize()

    def run(rank):
        return [pair.ranks[rank].all_reduce_add_rms_norm(c[rank], c[2], c[3], 1e-5)
                for c in cases]

    def check(results):
        for i, (want_out, want_res) in enumerate(refs):
            assert torch.equal(results[0][i][0], results[1][i][0])
            _close(results[0][i][1], want_res, dtype)
            _close(results[0][i][0], want_out, dtype)

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
from loom.kernels.all_reduce_norm_ll import _ll_all_reduce_add_rms_norm_kernel as fn
names = list(fn.arg_names)
cons = dict(N=4096, BLOCK=2048, WORLD=2, MAX_ROWS=64, ROW_WORDS=8192, BF16=True, PDL=False)
sig = {n: "constexpr" if n in cons else ("*i64" if n == "ll_ptrs" else "*i32" if n.endswith("ptr")
       else "fp32" if n == "eps" else "i32") for n in names}
src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in cons.items()},
                attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                       if sig[n].startswith("*")})
kernel = tcompile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8))
ptx = kernel.asm["ptx"]
assert kernel.asm["cubin"], "no cubin"
assert "ld.volatile.global" in ptx, "the poll is not a volatile load"
assert not any(f in ptx for f in ("fence.sc.sys", "membar.sys", ".release.sys")), "a fence"
print("ok")
"""


def test_compiles_for_sm90_offline_without_a_system_fence():
    """The compiled kernel, which the interpreter never exercises, builds for Hopper; it
    polls with volatile loads and has no system-scope fence or release."""
    from tests.triton_interpreter import compile_for_sm90_offline
    assert compile_for_sm90_offline(_OFFLINE_COMPILE).strip() == "ok"


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET, reason="symmetric memory needs CUDA")
@pytest.mark.parametrize("ll", ["0", "1"])
def test_the_symmetric_buffer_of_one_rank_takes_the_protocol_asked(ll, monkeypatch):
    """`SymmetricNormBuffer` made over a one-rank group (its allocation's layout, with and
    without the LL area after the flags): the LL kernel takes 16-bit rows where asked, and
    both paths give loom's add + norm (no peer to add)."""
    import socket

    import torch.distributed as dist

    from loom.kernels.all_reduce_norm import SymmetricNormBuffer, add_rms_norm
    monkeypatch.setenv("LOOM_AR_NORM_LL", ll)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1)
    try:
        group = dist.group.WORLD
        buf = SymmetricNormBuffer(group.group_name, torch.device("cuda"), group)
        assert (buf.ll is not None) == (ll == "1")
        for rows in (1, 3, 64):
            x0, _, residual, weight = _case(rows, 4096, torch.bfloat16, seed=rows)
            got = buf.all_reduce_add_rms_norm(x0, residual, weight, 1e-5)
            want = add_rms_norm(x0, residual, weight, 1e-5)
            assert torch.equal(got[1], want[1])
            torch.testing.assert_close(got[0], want[0], rtol=2 ** -7, atol=1e-2)
        if buf.ll is not None:
            assert buf.ll.state.tolist() == [3, 0], "three LL calls"
    finally:
        dist.destroy_process_group()
