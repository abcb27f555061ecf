"""The all-reduce + norm kernels over symmetric memory (kernels/all_reduce_norm.py's pull
and push, all_reduce_norm_ll.py's LL) give up on a peer that never arrives: after their
poll limit (all_reduce_norm_ll.MAX_SPIN) they trap, so the process's next CUDA call
raises and the worker fails, where they used to carry on with whatever the peer's buffer
held. Compiled for sm_90 offline (the trap is in the binary), and on CUDA one rank of two
launched alone with the limit lowered, in a subprocess (a trap ends its CUDA context)."""

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_OFFLINE_COMPILE = r"""
import os
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.all_reduce_norm import _all_reduce_add_rms_norm_kernel as pull
from loom.kernels.all_reduce_norm_ll import _ll_all_reduce_add_rms_norm_kernel as ll

def build(fn, cons, pointers):
    names = list(fn.arg_names)
    sig = {n: "constexpr" if n in cons else pointers.get(n, "fp32" if n == "eps" else "i32")
           for n in names}
    src = ASTSource(fn=fn, signature=sig,
                    constexprs={(names.index(k),): v for k, v in cons.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                           if sig[n].startswith("*")})
    ptx = tcompile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=8)).asm["ptx"]
    print(fn.__name__, cons.get("PUSH", "-"), sum("trap;" in l for l in ptx.splitlines()))

bf16 = {n: "*bf16" for n in ("x_ptr", "res_ptr", "w_ptr", "out_ptr", "res_out_ptr")}
for push in (False, True):
    build(pull, dict(N=4096, BLOCK=4096, WORLD=2, MAX_ROWS=8, PUSH=push, SLOT=8 * 16384,
                     PDL=False, SPIN=1 << 26),
          dict(bf16, data_ptrs="*i64", flag_ptrs="*i64"))
build(ll, dict(N=4096, BLOCK=2048, WORLD=2, MAX_ROWS=64, ROW_WORDS=8192, BF16=True, PDL=False,
               SPIN=1 << 26),
      {n: "*i32" for n in ("x_ptr", "res_ptr", "w_ptr", "out_ptr", "res_out_ptr", "state_ptr")}
      | {"ll_ptrs": "*i64"})
"""


def test_the_kernels_trap_after_their_poll_limit_sm90_offline():
    """Each compiled kernel holds a trap: pull and push after each of their two waits on a
    peer's flag (one peer: two sites), LL after its poll of the peer's words (one site;
    the compiler may copy a site's trap into more than one branch)."""
    from tests.triton_interpreter import compile_for_sm90_offline
    lines = compile_for_sm90_offline(_OFFLINE_COMPILE).split("\n")
    traps = {tuple(line.split()[:2]): int(line.split()[2]) for line in lines if line}
    least = {("_all_reduce_add_rms_norm_kernel", "False"): 2,
             ("_all_reduce_add_rms_norm_kernel", "True"): 2,
             ("_ll_all_reduce_add_rms_norm_kernel", "-"): 1}
    assert traps.keys() == least.keys(), traps
    assert all(traps[k] >= n for k, n in least.items()), traps


_ONE_RANK = r"""
import sys
import torch
from loom.kernels import all_reduce_norm, all_reduce_norm_ll
all_reduce_norm_ll.MAX_SPIN = 1000  # polls: microseconds, not tens of seconds
kind, peer_arrives = sys.argv[1], sys.argv[2] == "1"
rows, n = 2, 256
x, residual = (torch.randn(rows, n, dtype=torch.bfloat16, device="cuda") for _ in range(2))
weight = torch.ones(n, dtype=torch.bfloat16, device="cuda")
if kind == "ll":
    from tests.kernels.test_all_reduce_norm_ll import Pair
    pair = Pair()
    if peer_arrives:  # rank 1's words of the first epoch, as its call writes them
        pair.push_as(1, x, 1)
    pair.ranks[0].all_reduce_add_rms_norm(x, residual, weight, 1e-5)
else:
    max_rows = 4
    data = [torch.zeros(2 * max_rows * n, dtype=torch.bfloat16, device="cuda")
            for _ in range(2)]
    flags = [torch.zeros(2 * 2 * max_rows, dtype=torch.int32, device="cuda") for _ in range(2)]
    if peer_arrives:  # rank 1's two signals to rank 0 for each row: ready, then read
        flags[0][3 * max_rows:3 * max_rows + rows] = 1
        flags[0][max_rows:max_rows + rows] = 1
    def ptrs(ts):
        return torch.tensor([t.data_ptr() for t in ts], device="cuda")
    all_reduce_norm._launch(x, residual, weight, 1e-5, ptrs(data), ptrs(flags), 0, 2,
                            max_rows, push=kind == "push", slot_bytes=max_rows * n * 2)
torch.cuda.synchronize()
print("returned")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["pull", "push", "ll"])
def test_one_rank_alone_traps_and_the_process_sees_it(kind):
    """Rank 0 of two launched alone: with its peer's signals (or words) already there it
    returns; without, it traps once the lowered limit runs out, and the process's next
    CUDA call raises instead of returning rows the peer never wrote."""
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=ROOT)
    runs = {}
    for arrives in ("1", "0"):
        runs[arrives] = subprocess.run([sys.executable, "-c", _ONE_RANK, kind, arrives],
                                       env=env, cwd=ROOT, capture_output=True, text=True,
                                       timeout=300)
    ok, alone = runs["1"], runs["0"]
    assert ok.returncode == 0 and "returned" in ok.stdout, ok.stderr[-2000:]
    assert alone.returncode != 0 and "returned" not in alone.stdout, alone.stdout
    assert "CUDA error" in alone.stderr or "AcceleratorError" in alone.stderr, \
        alone.stderr[-2000:]
