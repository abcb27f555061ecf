"""Triton's CPU interpreter (TRITON_INTERPRET=1), made to run loom's kernels: the tests and
`loom bench attention`'s CPU runs use it; the GPU path never does."""

from __future__ import annotations


def interpreted(kernel) -> bool:
    """Whether a @triton.jit kernel was built for the interpreter (decided when triton is
    first imported, from TRITON_INTERPRET)."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(kernel, InterpretedFunction)


def fix_interpreter_loop_bounds() -> None:
    """Triton 3.6's interpreter turns a tensor loop bound into an int with int(array) on a
    shape-(1,) array, which numpy >= 2.4 rejects (triton-lang/triton#9171, fixed after
    3.6): read its one element instead. The kernels keep ordinary runtime-bounded loops,
    which the GPU compiler software-pipelines; only the interpreter's conversion is patched."""
    from triton.runtime import interpreter
    original = interpreter._patch_lang_tensor
    if getattr(original, "loom_fixed", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.loom_fixed = True
    interpreter._patch_lang_tensor = patched
