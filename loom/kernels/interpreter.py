"""Triton's CPU interpreter (TRITON_INTERPRET=1), made to run loom's kernels: the tests and
`loom bench attention`'s CPU runs use it; the GPU path never does."""

from __future__ import annotations


def interpreted(kernel) -> bool:
    """Whether a @triton.jit kernel was built for the interpreter (decided when triton is
    first imported, from TRITON_INTERPRET)."""
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(kernel, InterpretedFunction)


def patch_interpreter() -> None:
    """Three fixes to Triton 3.6's interpreter, for the tests and the CPU benchmarks; the GPU
    path never runs it, and the kernels stay as the GPU compiler wants them.

    - A tensor loop bound becomes an int through int(array) on a shape-(1,) array, which
      numpy >= 2.4 rejects (triton-lang/triton#9171, fixed after 3.6): read its one element
      instead. The kernels keep ordinary runtime-bounded loops, which the GPU compiler
      software-pipelines.
    - Its float-to-fp8 conversion rounds the mantissa without carrying into the exponent
      (1.95 becomes 1.0, not 2.0): fp8 results are taken from torch's conversion, round to
      nearest even as the GPU's cvt.rn is.
    - It multiplies bfloat16 dot operands as their raw uint16 storage: they are widened to
      float32 first (exact), as the tensor cores take them.
    - Its bfloat16 arithmetic (add, sub, mul, div) works on that raw storage too: done in
      float32 and rounded to nearest even, as sm_90's bf16 instructions round.
    """
    from triton.runtime import interpreter
    if getattr(interpreter._patch_lang_tensor, "loom_fixed", False):
        return
    original_patch = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original_patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched.loom_fixed = True
    interpreter._patch_lang_tensor = patched
    interpreter._convert_float = _fp8_by_torch(interpreter._convert_float)
    interpreter.InterpreterBuilder.create_dot = _bf16_dot_widened(
        interpreter.InterpreterBuilder.create_dot)
    interpreter.InterpreterBuilder.binary_op = _bf16_arith(
        interpreter.InterpreterBuilder.binary_op)


def _bf16_arith(original):
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter

    def as_float(t):
        return torch.from_numpy(np.ascontiguousarray(t.data).view(np.int16)).view(
            torch.bfloat16).float().numpy()

    def binary_op(self, lhs, rhs, op):
        if lhs.dtype.scalar != tl.bfloat16 or op not in (np.add, np.subtract, np.multiply,
                                                        np.divide):
            return original(self, lhs, rhs, op)
        out = torch.from_numpy(np.asarray(op(as_float(lhs), as_float(rhs)), np.float32))
        return interpreter.TensorHandle(out.to(torch.bfloat16).view(torch.int16).numpy()
                                        .view(np.uint16), tl.bfloat16)
    return binary_op


def _bf16_dot_widened(original):
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    def widen(t):
        if t.dtype.scalar != tl.bfloat16:
            return t
        data = interpreter._convert_float(t.data, tl.bfloat16, tl.float32, None)
        return interpreter.TensorHandle(data.view(np.float32), tl.float32)

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)
    return create_dot


def _fp8_by_torch(original):
    import numpy as np
    import torch
    import triton.language as tl
    sources = {tl.float32: torch.float32, tl.float16: torch.float16,
               tl.bfloat16: torch.bfloat16}
    targets = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}

    def convert(input, input_dtype, output_dtype, rounding_mode):
        source, target = sources.get(input_dtype), targets.get(output_dtype)
        if source is None or target is None:
            return original(input, input_dtype, output_dtype, rounding_mode)
        values = torch.frombuffer(bytearray(np.ascontiguousarray(input).tobytes()),
                                  dtype=source)
        return values.to(target).view(torch.uint8).numpy().reshape(input.shape)
    return convert
