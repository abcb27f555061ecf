"""Triton's CPU interpreter, made to run loom's kernels, and offline sm_90 compiles (tests only)."""

from loom.kernels.interpreter import patch_interpreter  # noqa: F401  (re-exported)


def compile_for_sm90_offline(script: str) -> str:
    """Run `script` in a fresh interpreter with TRITON_INTERPRET=0, where it compiles kernels
    for sm_90 with Triton's bundled ptxas (no GPU needed); its stdout. Skips the test when
    the wheel has no ptxas; fails with the script's stderr when it does not exit cleanly."""
    import os
    import subprocess
    import sys

    import pytest
    import triton
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia",
                                       "bin", "ptxas")):
        pytest.skip("Triton's bundled ptxas is missing")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="0",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=root,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


SM90_BUILD = r'''
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile

def build(fn, types, cons, warps, stages=3, aligned=("stride_x",)):
    """fn compiled for sm_90: its PTX. types: each argument's Triton type (i32 where not
    named); cons: the constexprs; pointers and the `aligned` integers 16-byte aligned,
    as Triton specializes them at a launch."""
    names = list(fn.arg_names)
    sig = {n: "constexpr" if n in cons else types.get(n, "i32") for n in names}
    divisible = [i for i, n in enumerate(names) if sig[n].startswith("*") or n in aligned]
    src = ASTSource(fn=fn, signature=sig,
                    constexprs={(names.index(k),): v for k, v in cons.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in divisible})
    kernel = tcompile(src, target=GPUTarget("cuda", 90, 32),
                      options=dict(num_warps=warps, num_stages=stages))
    assert kernel.asm["cubin"]
    return kernel.asm["ptx"]
'''
"""A script's prelude (for `compile_for_sm90_offline`) defining build(fn, types, cons,
warps, stages=3): compile one kernel for sm_90 and return its PTX."""
