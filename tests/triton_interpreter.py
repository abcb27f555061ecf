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
