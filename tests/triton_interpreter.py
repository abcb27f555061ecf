"""Triton's CPU interpreter, made to run loom's kernels (tests only)."""


def fix_interpreter_loop_bounds() -> None:
    """Triton 3.6's interpreter turns a tensor loop bound into an int with int(array) on a
    shape-(1,) array, which numpy >= 2.4 rejects (triton-lang/triton#9171, fixed after
    3.6). The kernels keep ordinary runtime-bounded loops, which the GPU compiler software-
    pipelines; only the interpreter's conversion is patched, and only in tests."""
    from triton.runtime import interpreter
    original = interpreter._patch_lang_tensor
    if getattr(original, "loom_fixed", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.loom_fixed = True
    interpreter._patch_lang_tensor = patched


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
