"""The GEMM of int8 W8A8 linear layers for prompt rows on CUDA: int8 activations quantized
per token (one float32 scale a row) times an int8 weight scaled per output channel (one
float32 scale a column), out = (xq @ weight^T) * x_scale[m] * weight_scale[n].

Two ways to compute it, alternatives for a GPU benchmark to choose between:

* `int8_gemm`: loom's Triton GEMM. Program (m, n) owns a BLOCK_M x BLOCK_N output tile
  (program ids swizzled GROUP_M row tiles at a time, so that the programs running together
  share their weight tiles in L2) and walks K in BLOCK_K steps, each step's int8 tile product
  (`tl.dot`, int8 tensor cores, int32 out) added to an int32 accumulator. Since both scales
  are constant along K, they are applied once, in an epilogue: the sum converted to float32
  and multiplied by its row's and its column's scales in float32, rounded once to the output
  dtype. The int32 sum is exact (|product| <= 2^14: K below 2^17 cannot overflow it),
  where a float32 accumulator would drop units past 2^24.
* `int_mm_gemm`: cuBLAS's int8 GEMM through `torch._int_mm` (int32 out), then one Triton
  epilogue pass that reads the int32 product and writes the scaled output. It writes and
  reads an M x N int32 intermediate that the fused GEMM never makes, against cuBLAS's tuned
  main loop. On CUDA `_int_mm` wants more than 16 rows and K and N multiples of 8: fewer
  rows are padded with zero rows (their products never read), other K or N are refused.

N and K are constexprs (one compile per layer shape; the K loop's bound is then a constexpr
too, which the CPU interpreter needs); M is not. Ragged M, N and K tails are masked, loads
of the tails reading zeros, which add nothing to the sums.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from loom.kernels.fp8_block_gemm import swizzled_tile
from loom.kernels.host import cdiv, next_power_of_2
from loom.kernels.launch import fast_launch

OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MIN_BLOCK_K = 32
"""An int8 tensor-core dot takes K in steps of 32 (mma.sync m16n8k32, wgmma k32)."""
MAX_K = 1 << 17
"""K * 128 * 128 must stay below 2^31 for the int32 sums."""


@triton.jit
def _int8_gemm_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, stride_a, stride_b, stride_c,
                      N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # a: int8 activations [M, K], as: their scales [M]; b: the int8 weight [N, K], bs: its
    # scales [N]; c = (a @ b^T) * as[:, None] * bs[None, :], [M, N].
    pid_m, pid_n = swizzled_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_a + rk[None, :]
    b_ptrs = b_ptr + rn.to(tl.int64)[None, :] * stride_b + rk[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for step in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = step * BLOCK_K + rk < K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0)
        b = tl.load(b_ptrs, mask=n_ok[None, :] & k_ok[:, None], other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    a_scale = tl.load(as_ptr + rm, mask=m_ok, other=0.0)
    b_scale = tl.load(bs_ptr + rn, mask=n_ok, other=0.0)
    c = acc.to(tl.float32) * a_scale[:, None] * b_scale[None, :]
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_c + rn[None, :]
    tl.store(c_ptrs, c.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _scale_kernel(p_ptr, as_ptr, bs_ptr, c_ptr, M, stride_p, stride_c, N: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # p: the int32 product [M, N] (rows may be strided); c = p * as[:, None] * bs[None, :]
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    ok = m_ok[:, None] & n_ok[None, :]
    p = tl.load(p_ptr + rm.to(tl.int64)[:, None] * stride_p + rn[None, :], mask=ok, other=0)
    a_scale = tl.load(as_ptr + rm, mask=m_ok, other=0.0)
    b_scale = tl.load(bs_ptr + rn, mask=n_ok, other=0.0)
    c = p.to(tl.float32) * a_scale[:, None] * b_scale[None, :]
    tl.store(c_ptr + rm.to(tl.int64)[:, None] * stride_c + rn[None, :],
             c.to(c_ptr.dtype.element_ty), mask=ok)


@dataclasses.dataclass(frozen=True)
class Int8GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3


def default_config(m: int) -> Int8GemmConfig:
    """Guesses for Hopper (H100/H200), not yet measured: a benchmark should replace them.
    From 128 rows the usual square 128 x 128 tile with 128-deep int8 steps (16 KiB of A and
    16 of B a stage: 128 KiB of shared memory over four stages, of Hopper's 227), 8 warps
    (two warpgroups) for the 128-row tile; fewer rows take shorter tiles, so that less of
    each tile is masked padding and more column tiles run as separate programs (a
    decode-like launch is bound by reading the weight once, spread over as many SMs as it
    can). Tiles keep at least 16 rows and columns, and K steps of MIN_BLOCK_K or more."""
    if m <= 64:
        return Int8GemmConfig(max(16, next_power_of_2(m)), 64, 128, 8, num_warps=4,
                              num_stages=4)
    if m < 128:
        return Int8GemmConfig(64, 128, 128, 8, num_warps=4, num_stages=4)
    return Int8GemmConfig(128, 128, 128, 8, num_warps=8, num_stages=4)


def _check(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
           weight_scale: torch.Tensor, out_dtype: torch.dtype, name: str) -> None:
    """ValueError unless the operands are as the kernels read them."""
    if xq.dtype != torch.int8 or weight.dtype != torch.int8:
        raise ValueError(f"{name}: xq and weight must be int8, got {xq.dtype} and "
                         f"{weight.dtype}")
    if x_scale.dtype != torch.float32 or weight_scale.dtype != torch.float32:
        raise ValueError(f"{name}: x_scale and weight_scale must be float32, got "
                         f"{x_scale.dtype} and {weight_scale.dtype}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"{name}: out_dtype must be bfloat16, float16 or float32, got "
                         f"{out_dtype}")
    if xq.dim() != 2 or weight.dim() != 2 or xq.shape[1] != weight.shape[1]:
        raise ValueError(f"{name}: xq [M, K] and weight [N, K] shapes do not fit: "
                         f"{tuple(xq.shape)} and {tuple(weight.shape)}")
    (m, k), n = xq.shape, weight.shape[0]
    if k >= MAX_K:
        raise ValueError(f"{name}: K ({k}) must be below 2^17, where int32 sums of int8 "
                         "products could overflow")
    if tuple(x_scale.shape) != (m, 1) or tuple(weight_scale.shape) not in ((n, 1), (n,)):
        raise ValueError(f"{name}: scale shapes {tuple(x_scale.shape)} and "
                         f"{tuple(weight_scale.shape)} must be ({m}, 1) and ({n}, 1) or ({n},)")
    if not all(t.is_contiguous() for t in (xq, x_scale, weight, weight_scale)):
        raise ValueError(f"{name}: xq, x_scale, weight and weight_scale must be contiguous")
    if len({t.device for t in (xq, x_scale, weight, weight_scale)}) != 1:
        raise ValueError(f"{name}: operands on different devices: xq {xq.device}, x_scale "
                         f"{x_scale.device}, weight {weight.device}, weight_scale "
                         f"{weight_scale.device}")


def int8_gemm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
              weight_scale: torch.Tensor, out_dtype: torch.dtype,
              config: Int8GemmConfig | None = None) -> torch.Tensor:
    """(xq @ weight^T) * x_scale * weight_scale^T, out_dtype [M, N], by loom's Triton GEMM:
    xq int8 [M, K], x_scale float32 [M, 1], weight int8 [N, K], weight_scale float32 [N, 1]
    or [N], all contiguous on one device. The int32 sum is exact; the scaling is float32."""
    _check(xq, x_scale, weight, weight_scale, out_dtype, "int8_gemm")
    (m, k), n = xq.shape, weight.shape[0]
    out = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    cfg = config or default_config(m)
    blocks = (cfg.block_m, cfg.block_n, cfg.block_k)
    if any(b < 16 or b & (b - 1) for b in blocks) or cfg.block_k < MIN_BLOCK_K \
            or cfg.group_m < 1:
        raise ValueError(f"int8_gemm: block sizes {blocks} must be powers of two >= 16 "
                         f"(tl.dot's smallest tile), block_k >= {MIN_BLOCK_K} and group_m "
                         f"({cfg.group_m}) positive")
    grid = (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n),)
    fast_launch(_int8_gemm_kernel, grid)(
        xq, x_scale, weight, weight_scale, out, m, xq.stride(0), weight.stride(0),
        out.stride(0), N=n, K=k, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    return out


INT_MM_MIN_ROWS = 17
"""cuBLAS's int8 GEMM through torch._int_mm takes more than 16 rows on CUDA."""
_EPILOGUE_BLOCK = (32, 128)


def int_mm_gemm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
                weight_scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """The same as `int8_gemm`, by `torch._int_mm` (cuBLAS's int8 GEMM on CUDA, int32 out)
    then one Triton pass scaling its product. K and N must be multiples of 8; M <= 16 rows
    are multiplied padded with zero rows to 17."""
    _check(xq, x_scale, weight, weight_scale, out_dtype, "int_mm_gemm")
    (m, k), n = xq.shape, weight.shape[0]
    if k % 8 or n % 8:
        raise ValueError(f"int_mm_gemm: K ({k}) and N ({n}) must be multiples of 8 "
                         "(torch._int_mm)")
    out = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m == 0:
        return out
    if m < INT_MM_MIN_ROWS:
        xq = torch.cat([xq, xq.new_zeros(INT_MM_MIN_ROWS - m, k)])
    product = torch._int_mm(xq, weight.t())  # [max(M, 17), N] int32; rows past M unread
    block_m, block_n = _EPILOGUE_BLOCK
    fast_launch(_scale_kernel, (cdiv(m, block_m), cdiv(n, block_n)))(
        product, x_scale, weight_scale, out, m, product.stride(0), out.stride(0), N=n,
        BLOCK_M=block_m, BLOCK_N=block_n)
    return out
