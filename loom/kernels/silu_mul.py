"""SwiGLU's activation, silu(gate) * up, rounded as torch's eager ops round it: the
values (`silu_mul_values`, which the GEMV applies to the down projection's input as it
reads it, `gemv.py`) and one kernel over a [M, 2K] = [gate | up] activation (`silu_mul`,
where the down projection takes cuBLAS)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels.host import cdiv
from loom.kernels.launch import fast_launch


@triton.jit
def silu_mul_values(gate, up, elem: tl.constexpr):
    """torch's eager silu(gate) * up: silu in float32 rounded to elem, the product again."""
    g = gate.to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(elem)
    return (s.to(tl.float32) * up.to(tl.float32)).to(elem)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, K, stride_x, stride_o, BLOCK: tl.constexpr):
    # grid: (row, column block). x [M, 2K] = [gate | up] -> out [M, K].
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < K
    gate = tl.load(x_ptr + row * stride_x + cols, mask=ok)
    up = tl.load(x_ptr + row * stride_x + K + cols, mask=ok)
    act = silu_mul_values(gate, up, out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_o + cols, act, mask=ok)


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for x [M, 2K] = [gate | up], as torch's eager ops round it, in one
    kernel (eager torch takes two, each reading and writing the whole activation)."""
    k = x.shape[1] // 2
    if x.dim() != 2 or x.shape[1] != 2 * k or x.stride(1) != 1:
        raise ValueError(f"silu_mul: x must be [M, 2K] with contiguous rows, got "
                         f"{tuple(x.shape)} strides {x.stride()}")
    out = torch.empty(x.shape[0], k, dtype=x.dtype, device=x.device)
    if out.numel():
        block = 1024
        fast_launch(_silu_mul_kernel, (x.shape[0], cdiv(k, block)))(
            x, out, k, x.stride(0), out.stride(0), BLOCK=block)
    return out
