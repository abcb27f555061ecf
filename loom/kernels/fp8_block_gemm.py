"""Block-wise fp8 linear layers on CUDA (`loom.quantization.fp8_block` has the maths and
the CPU reference), behind one opaque op, `loom::fp8_block_linear`:

* `quantize_groups`: a Triton kernel; each program takes a tile of a row's groups of
  GROUP_K features, each group's amax, its scale amax / 448 (at least float32's eps) and
  the fp8 values x / scale, divided and rounded as torch's ops do (`div_rn`,
  round-to-nearest-even fp8), so the GPU quantizes activations to the CPU's very bytes.
* the GEMM. torch 2.11's `torch.nn.functional.scaled_mm` has cuBLASLt's BlockWise1x128 x
  BlockWise128x128 scaling (sm_90 only, CUDA 12.9+, 128-blocks, N a multiple of 128, row
  counts a multiple of 4). On the H200 it ran Qwen3-8B's projections at 1110-1275 TFLOP/s
  with 8192 rows, quantization included (bf16 F.linear: 780-815), and as fast as bf16 or
  faster at decode sizes (benchmarks/gpu/fp8_block_probe.py), so it takes every shape it
  can (`_use_cublas`, with K a multiple of 512 so its scales need no padded copy).
* `_block_gemm_kernel`, loom's Triton GEMM, takes the rest (other block sizes, ragged
  shapes, GPUs other than sm_90), each reason logged once: program (m, n) owns a BLOCK_M x
  BLOCK_N output tile and walks K in BLOCK_K steps inside one scale group (BLOCK_K divides
  GROUP_K); each step's fp8 tile product (`tl.dot`, fp8 tensor cores on sm_89+, float32
  out) is scaled by its rows' activation scales and its columns' weight scales and added to
  a float32 accumulator. That per-block promotion also bounds the drift of Hopper's
  reduced-precision fp8 accumulation. It reaches 570-640 TFLOP/s at 8192 rows on the H200,
  about half of cuBLASLt (its scaling is not overlapped with the next tile's dot).

The Triton GEMM reads the weight scale per output column, w_scale[n // GROUP_N, kb], so a
tile needs not match the weight blocks' rows, and ragged M, N and K (ceil-sized scales,
masked tails) need nothing special. N and K are constexprs (one compile per layer shape;
the K loop's bound is then a constexpr too, which the CPU interpreter needs); M is not.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from loom.kernels.host import cdiv, next_power_of_2
from loom.kernels.launch import fast_launch
from loom.library import loom_op

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
EPS = torch.finfo(torch.float32).eps
MIN_BLOCK_K = 32
"""An fp8 tensor-core dot takes K in steps of 32 on sm_90: the scale groups must hold a
power-of-two multiple of it (every release's 128 does)."""


@triton.jit
def _quantize_groups_kernel(x_ptr, q_ptr, s_ptr, stride_x, stride_q, stride_sm, stride_sg,
                            K: tl.constexpr, GROUP_K: tl.constexpr, GROUPS: tl.constexpr,
                            TILE_G: tl.constexpr, BLOCK: tl.constexpr, FMAX: tl.constexpr,
                            EPS_: tl.constexpr):
    # program (row, g): groups g * TILE_G .. + TILE_G of one row, as a [TILE_G, BLOCK] tile
    row = tl.program_id(0).to(tl.int64)
    groups = tl.program_id(1) * TILE_G + tl.arange(0, TILE_G)
    offs = tl.arange(0, BLOCK)
    cols = groups[:, None] * GROUP_K + offs[None, :]
    ok = (groups < GROUPS)[:, None] & (offs < GROUP_K)[None, :] & (cols < K)
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), axis=1), FMAX), EPS_)
    q = tl.clamp(tl.math.div_rn(x, scale[:, None]), -FMAX, FMAX)
    tl.store(q_ptr + row * stride_q + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row * stride_sm + groups * stride_sg, scale, mask=groups < GROUPS)


def quantize_groups(x: torch.Tensor, group_k: int,
                    out: tuple[torch.Tensor, torch.Tensor] | None = None,
                    rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K), rows contiguous -> fp8 (M, K) and float32 scales (M, ceil(K / group_k)),
    written into `out` where given. rows: cuBLASLt's layout instead, `rows` >= M rows (the
    rest left unwritten) and the scales column-major (strides (1, rows))."""
    m, k = x.shape
    groups = cdiv(k, group_k)
    if out is None and rows is not None:
        out = (torch.empty(rows, k, dtype=FP8, device=x.device),
               torch.empty_strided((rows, groups), (1, rows), dtype=torch.float32,
                                   device=x.device))
    q, scale = out or (torch.empty(m, k, dtype=FP8, device=x.device),
                       torch.empty(m, groups, dtype=torch.float32, device=x.device))
    block = next_power_of_2(group_k)
    # a tile of up to 2048 values a program: one 128-feature group per program made
    # 8192 x 4096 take 156 us on the H200 (six times its copy time)
    tile_g = min(max(1, 2048 // block), next_power_of_2(groups))
    if m:
        fast_launch(_quantize_groups_kernel, (m, cdiv(groups, tile_g)))(
            x, q, scale, x.stride(0), q.stride(0), scale.stride(0), scale.stride(1), K=k,
            GROUP_K=group_k, GROUPS=groups, TILE_G=tile_g, BLOCK=block, FMAX=FP8_MAX,
            EPS_=EPS)
    return q, scale


@triton.jit
def swizzled_tile(pid, M, N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  SWIZZLE_M: tl.constexpr):
    """Program -> (row tile, column tile), SWIZZLE_M row tiles at a time walking the column
    tiles, so that the programs running together share their weight tiles and their rows
    in L2 (a prompt's activations can outgrow it: 8192 x 12288 fp8 is 100 MB)."""
    tiles_n: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    first_m = pid // (SWIZZLE_M * tiles_n) * SWIZZLE_M
    rows = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, SWIZZLE_M)
    within = pid % (SWIZZLE_M * tiles_n)
    return first_m + within % rows, within // rows


@triton.jit
def _block_gemm_kernel(a_ptr, as_ptr, b_ptr, bs_ptr, c_ptr, M, stride_a, stride_b, stride_c,
                       N: tl.constexpr, K: tl.constexpr, K_GROUPS: tl.constexpr,
                       GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWIZZLE_M: tl.constexpr):
    # a: fp8 activations [M, K], as: their scales [M, K_GROUPS]; b: the fp8 weight [N, K],
    # bs: its scales [ceil(N / GROUP_N), K_GROUPS]; c = a @ b^T [M, N].
    pid_m, pid_n = swizzled_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, SWIZZLE_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_a + rk[None, :]
    b_ptrs = b_ptr + rn.to(tl.int64)[None, :] * stride_b + rk[:, None]
    as_ptrs = as_ptr + rm.to(tl.int64) * K_GROUPS
    bs_ptrs = bs_ptr + (rn // GROUP_N) * K_GROUPS
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = step * BLOCK_K + rk < K
        a = tl.load(a_ptrs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        kb = step * BLOCK_K // GROUP_K
        a_scale = tl.load(as_ptrs + kb, mask=m_ok, other=0.0)
        b_scale = tl.load(bs_ptrs + kb, mask=n_ok, other=0.0)
        acc += tl.dot(a, b) * a_scale[:, None] * b_scale[None, :]
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_c + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@dataclasses.dataclass(frozen=True)
class BlockGemmConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    swizzle_m: int = 8


def default_config(m: int, group_k: int) -> BlockGemmConfig:
    """Tiles from benchmarks/gpu/fp8_block_probe.py on the H200 (Qwen3-8B's projections,
    128-blocks): 16 x 32 for a handful of rows (more programs for a GEMV-like launch: 22
    against 27 us at M=1 for qkv's 6144 x 4096, 46 against 61 us for down's K=12288), 64 x 64
    up to 128 rows, 128 x 128 with 8 warps and 4 stages beyond (570-640 TFLOP/s at 8192
    rows; 4 warps or 128 x 256 tiles ran at a third to a half of that)."""
    block_k = min(128, group_k & -group_k)  # the largest power of two dividing the group
    if m <= 16:
        return BlockGemmConfig(16, 32, block_k, num_warps=4, num_stages=4)
    if m <= 128:
        return BlockGemmConfig(min(64, next_power_of_2(m)), 64, block_k, 4, 4)
    return BlockGemmConfig(128, 128, block_k, num_warps=8, num_stages=4)


def block_gemm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
               weight_scale: torch.Tensor, block: tuple[int, int], out_dtype: torch.dtype,
               config: BlockGemmConfig | None = None,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """(xq * x_scale) @ (weight * weight_scale)^T over k-blocks, out_dtype [M, N] (into
    `out` where given). Scales contiguous, as `quantize_groups` and the loader make them."""
    (m, k), n = xq.shape, weight.shape[0]
    cfg = config or default_config(m, block[1])
    if block[1] % cfg.block_k:
        raise ValueError(f"block_gemm: block_k {cfg.block_k} must divide the scale group "
                         f"{block[1]}")
    groups = cdiv(k, block[1])
    if x_scale.shape != (m, groups) or weight_scale.shape != (cdiv(n, block[0]), groups) \
            or not (x_scale.is_contiguous() and weight_scale.is_contiguous()):
        raise ValueError(f"block_gemm: scales {tuple(x_scale.shape)} and "
                         f"{tuple(weight_scale.shape)} do not fit x {tuple(xq.shape)}, the "
                         f"weight {tuple(weight.shape)} and {block[0]}x{block[1]} blocks, or "
                         "are not contiguous")
    if out is None:
        out = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m:
        grid = (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n),)
        fast_launch(_block_gemm_kernel, grid)(
            xq, x_scale, weight, weight_scale, out, m, xq.stride(0), weight.stride(0),
            out.stride(0), N=n, K=k, K_GROUPS=groups, GROUP_N=block[0],
            GROUP_K=block[1], BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, SWIZZLE_M=cfg.swizzle_m, num_warps=cfg.num_warps,
            num_stages=cfg.num_stages)
    return out


def kernel_applies(block: tuple[int, int]) -> bool:
    """Whether the block's scale groups fit the fp8 dot's K steps."""
    group_k = block[1]
    return (group_k & -group_k) >= MIN_BLOCK_K


@functools.cache
def _use_cublas(n: int, k: int, block: tuple[int, int], out_dtype: torch.dtype,
                device: torch.device) -> bool:
    """Whether cuBLASLt's block-wise scaled_mm takes this shape; where it cannot, the Triton
    GEMM does, and the first shape that falls to it for each reason logs the reason."""
    why = _why_not_cublas(n, k, block, out_dtype, device)
    if why is not None and why not in _told:
        _told.add(why)
        logger.info("block-wise fp8: loom's Triton block GEMM, not cuBLASLt's block-wise "
                    "scaled_mm (first at N=%d, K=%d): %s", n, k, why)
    return why is None


_told: set[str] = set()


def _why_not_cublas(n: int, k: int, block: tuple[int, int], out_dtype: torch.dtype,
                    device: torch.device) -> str | None:
    scaling = getattr(F, "ScalingType", None)
    if scaling is None or not hasattr(scaling, "BlockWise128x128"):
        return f"torch {torch.__version__} has no block-wise scaled_mm"
    if torch.cuda.get_device_capability(device) != (9, 0):
        return "cuBLASLt scales 128 x 128 blocks on sm_90 only"
    if tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2]) < (12, 9):
        return f"CUDA {torch.version.cuda} (block-wise scaling needs 12.9)"
    if block != (128, 128):
        return f"{block[0]} x {block[1]} blocks (cuBLASLt's are 128 x 128)"
    if n % 128 or k % 512:
        # weight scales padded to a multiple of 4 k-blocks: K % 512 needs no padded copy
        return "N is not a multiple of 128, or K of 512"
    if out_dtype not in _CUBLAS_OUT:
        return f"{out_dtype} output"
    return None


_CUBLAS_OUT = (torch.bfloat16, torch.float16, torch.float32)


def _cublas_block_mm(x: torch.Tensor, weight: torch.Tensor,
                     weight_scale: torch.Tensor) -> torch.Tensor:
    # cuBLASLt refuses (CUBLAS_STATUS_NOT_SUPPORTED) row counts that are not a multiple of
    # 4, whose column-major scales' columns are not 16-byte aligned: the rows beyond M are
    # left unwritten, and their outputs dropped (each output row reads only its own)
    m = x.shape[0]
    xq, x_scale = quantize_groups(x, 128, rows=cdiv(m, 4) * 4)
    # weight_scale (N / 128, K / 128), rows contiguous: its transpose is the column-major
    # (K / 128, N / 128) that cuBLASLt reads for a K-by-N operand
    return F.scaled_mm(xq, weight.t(), x_scale, F.ScalingType.BlockWise1x128,
                       weight_scale.t(), F.ScalingType.BlockWise128x128,
                       output_dtype=x.dtype)[:m]


@loom_op("fp8_block_linear",
         "(Tensor x, Tensor weight, Tensor weight_scale, int block_n, int block_k) -> Tensor")
def fp8_block_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     block_n: int, block_k: int) -> torch.Tensor:
    """x (M, K) @ the block-scaled fp8 weight (N, K)^T, x's dtype out: x quantized per token
    group, then cuBLASLt's block-wise GEMM where it applies (sm_90, 128 x 128 blocks: about
    twice the Triton GEMM's speed at prompt sizes on the H200), else the Triton one. One
    opaque op, so that compiled graphs hold it as a node."""
    x, block = x.contiguous(), (block_n, block_k)
    (n, k), m = weight.shape, x.shape[0]
    if m and x.is_cuda and weight_scale.is_contiguous() \
            and _use_cublas(n, k, block, x.dtype, x.device):
        return _cublas_block_mm(x, weight, weight_scale)
    xq, x_scale = quantize_groups(x, block_k)
    return block_gemm(xq, x_scale, weight, weight_scale.contiguous(), block, x.dtype)


@fp8_block_linear.register_fake
def _(x, weight, weight_scale, block_n, block_k):
    return x.new_empty(x.shape[0], weight.shape[0])
