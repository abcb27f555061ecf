"""Per-channel fp8 linear layers on CUDA (`loom.quantization.fp8` has the layers and the
CPU reference), behind one opaque op, `loom::fp8_linear`, that picks per call from the
real row count:

* 1..MAX_M rows (decode), where the GEMV has a config for the shape: loom's GEMV reads the
  fp8 weight and scales each output row's sums by its weight scale
  (`gemv(weight_scale=)`). At one row cuBLASLt's fp8 GEMMs read the weight at ~37% of
  the copy rate (run_zzz91), which made fp8 decode slower than bf16's. The rows are not
  quantized there (W8A16): one rounding fewer than the W8A8 path, so a request's logits
  at decode differ from what the same rows would get in a larger batch by about the
  activations' fp8 rounding (the bf16 GEMV and cuBLAS differ by summation order only).
* otherwise: the rows quantized per token (or by the checkpoint's static scale) by
  `quantize_rows`, then `torch._scaled_mm` with row-wise scales (bf16 out). The
  quantization is one Triton kernel, one program a row holding the whole row: one read
  and one write of the activations. Inductor's fused reduction for the down projection
  (K = 14336) took 1340 us at 8192 rows on the H200, 20x its bytes' time (run_zzz91);
  this one 69 us on average over 8B's projections (run_zzz94). Before a down projection
  it applies the SiLU·mul itself (`decode_silu_mul_linear`), and before qkv and gate_up
  at TP=1 the residual add + RMSNorm (`decode_add_rms_norm_linear`), so that neither
  activation is written in bf16 and read back.

int8 weights (W8A8-INT8 checkpoints, `loom.quantization.config`) take the same op and the
same two paths: the GEMV reads int8 as it reads fp8 (each value exact in x's dtype, the
row's sums times its scale), and prompt rows are quantized to int8 by the same kernel (amax
/ 127.5, rounded half to even, compressed-tensors' maths) for `loom.kernels.int8_gemm`
(int32 accumulation, both scales applied once at the end). cuBLASLt has no int8 GEMM with
row-wise scales in torch, which is why that one is loom's.

Configs: `gemv_decode.weight_config`, from the table measured for fp8 weights
(`benchmarks/gpu/gemv_bench.py --weight-dtype fp8 --write-table`) or, where the GPU has
none, the bf16 table's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels.fp8_block_gemm import EPS, FP8, FP8_MAX
from loom.kernels.gemv import gemv
from loom.kernels.gemv_decode import weight_config
from loom.kernels.host import next_power_of_2
from loom.kernels.int8_gemm import int8_gemm
from loom.kernels.launch import fast_launch
from loom.kernels.silu_mul import silu_mul_values
from loom.library import loom_op
from loom.quantization.fp8 import INT8, INT8_RANGE



@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, in_scale_ptr, res_ptr, nw_ptr, res_out_ptr,
                          eps, stride_x, K: tl.constexpr, BLOCK: tl.constexpr,
                          STATIC: tl.constexpr, FMAX: tl.constexpr, EPS_: tl.constexpr,
                          SILU_MUL: tl.constexpr = False, ADD_NORM: tl.constexpr = False,
                          INT: tl.constexpr = False):
    # program r: row r whole. scale = amax / 448 (at least float32's eps), or the static
    # scale; q = x / scale, divided and rounded as torch's ops do (the CPU's very bytes).
    # INT (int8 out): scale = amax / 127.5 (FMAX), q clamped to [-128, 127] and rounded half
    # to even, as torch.round: adding and taking away 1.5 * 2^23 leaves a float32 of
    # magnitude <= 2^22 rounded to an integer by IEEE round-to-nearest-even.
    # SILU_MUL: the row is [gate | up] (2K wide) and x = silu(gate) * up, rounded as
    # torch's eager ops round it (`silu_mul_values`). ADD_NORM: h = x + residual goes to
    # res_out and x = RMSNorm(h) * norm weight, rounded as `loom.layers.norm.rms_norm`.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < K
    elem = x_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if SILU_MUL:
        up = tl.load(x_ptr + row * stride_x + K + cols, mask=ok, other=0.0)
        x = silu_mul_values(x, up, elem)
    if ADD_NORM:
        res = tl.load(res_ptr + row * K + cols, mask=ok, other=0.0)
        h = (x.to(tl.float32) + res.to(tl.float32)).to(elem)
        tl.store(res_out_ptr + row * K + cols, h, mask=ok)
        hf = h.to(tl.float32)
        normed = (hf * tl.math.rsqrt(tl.sum(hf * hf, axis=0) / K + eps)).to(elem)
        w = tl.load(nw_ptr + cols, mask=ok, other=0.0)
        x = (w.to(tl.float32) * normed.to(tl.float32)).to(elem)
    x = x.to(tl.float32)
    if STATIC:
        scale = tl.load(in_scale_ptr)
    else:
        scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(x), axis=0), FMAX), EPS_)
    if INT:
        q = (tl.clamp(tl.math.div_rn(x, scale), -128.0, 127.0) + 12582912.0) - 12582912.0
    else:
        q = tl.clamp(tl.math.div_rn(x, scale), -FMAX, FMAX)
    tl.store(q_ptr + row * K + cols, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + row, scale)


def quantize_rows(x: torch.Tensor, input_scale: torch.Tensor | None = None,
                  silu_mul_input: bool = False,
                  dtype: torch.dtype = FP8) -> tuple[torch.Tensor, torch.Tensor]:
    """x (M, K), rows with unit column stride -> fp8 (M, K) and float32 scales (M, 1): per
    row (amax / 448), or input_scale's one value for every row. silu_mul_input: x is
    (M, 2K) = [gate | up], and silu(gate) * up is quantized (an MLP's down projection:
    the activation is never written in the model's dtype). dtype int8: int8 rows, amax /
    127.5 (`loom.quantization.fp8.quantize_rows`'s int8 maths)."""
    return _quantize(x, input_scale, silu_mul_input, dtype=dtype)[:2]


def add_rms_norm_quantize_rows(x: torch.Tensor, residual: torch.Tensor,
                               norm_weight: torch.Tensor, eps: float,
                               input_scale: torch.Tensor | None = None,
                               dtype: torch.dtype = FP8
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decoder's residual add and RMSNorm (`loom.layers.norm.fused_add_rms_norm`) with
    the quantization of the normalised rows, in one kernel: (fp8 rows, scales, x +
    residual). The normalised rows are never written in the model's dtype and read back
    (~2 ms of 8B's fp8 prefill at 8192 tokens, run_zzz94). x, residual (M, K) contiguous
    alike, norm_weight (K,). dtype: as quantize_rows'."""
    if residual.shape != x.shape or residual.dtype != x.dtype or norm_weight.shape != x.shape[1:]:
        raise ValueError(f"add_rms_norm_quantize_rows: residual {tuple(residual.shape)} and "
                         f"norm_weight {tuple(norm_weight.shape)} must match x "
                         f"{tuple(x.shape)} {x.dtype}")
    return _quantize(x.contiguous(), input_scale, False,
                     (residual.contiguous(), norm_weight.contiguous(), float(eps)), dtype)


def _quantize(x: torch.Tensor, input_scale: torch.Tensor | None, silu_mul_input: bool,
              norm: tuple[torch.Tensor, torch.Tensor, float] | None = None,
              dtype: torch.dtype = FP8):
    if dtype not in (FP8, INT8):
        raise ValueError(f"quantize_rows: dtype {dtype} is neither {FP8} nor {INT8}")
    m, k = x.shape[0], x.shape[1] // 2 if silu_mul_input else x.shape[1]
    q = torch.empty(m, k, dtype=dtype, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    residual, norm_weight, eps = norm or (x, x, 0.0)
    residual_out = torch.empty_like(x) if norm is not None else x
    if m:
        block = next_power_of_2(k)
        fast_launch(_quantize_rows_kernel, (m,))(
            x, q, scale, scale if input_scale is None else input_scale, residual,
            norm_weight, residual_out, eps, x.stride(0), K=k, BLOCK=block,
            STATIC=input_scale is not None, FMAX=FP8_MAX if dtype == FP8 else INT8_RANGE,
            EPS_=EPS, SILU_MUL=silu_mul_input, ADD_NORM=norm is not None, INT=dtype == INT8,
            num_warps=min(16, max(1, block // 1024)))
    return q, scale, residual_out


def scaled_mm_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                     input_scale: torch.Tensor | None = None,
                     silu_mul_input: bool = False) -> torch.Tensor:
    """x (M, K) @ the fp8 weight (N, K)^T by `quantize_rows` then cuBLASLt's row-wise scaled
    GEMM; x's dtype out (the GEMM writes bf16 only). silu_mul_input: as quantize_rows. An
    int8 weight: the rows quantized to int8, then `int8_gemm`."""
    xq, x_scale = quantize_rows(x, input_scale, silu_mul_input, weight.dtype)
    return _scaled_mm(xq, x_scale, weight, weight_scale, x.dtype)


def add_rms_norm_scaled_mm_linear(
        x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
        weight: torch.Tensor, weight_scale: torch.Tensor,
        input_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(RMSNorm(x + residual) @ the fp8 weight^T, x + residual) by
    `add_rms_norm_quantize_rows` then the scaled GEMM: a decoder's qkv or gate_up at a
    prompt's rows, its norm and quantization one kernel."""
    xq, x_scale, residual_out = add_rms_norm_quantize_rows(x, residual, norm_weight, eps,
                                                           input_scale, weight.dtype)
    return _scaled_mm(xq, x_scale, weight, weight_scale, x.dtype), residual_out


def _scaled_mm(xq: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor,
               weight_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if weight.dtype == INT8:
        return int8_gemm(xq, x_scale, weight, weight_scale, dtype)
    y = torch._scaled_mm(xq, weight.t(), scale_a=x_scale, scale_b=weight_scale.reshape(1, -1),
                         out_dtype=torch.bfloat16)
    return y if y.dtype == dtype else y.to(dtype)


@loom_op("fp8_linear",
         "(Tensor x, Tensor weight, Tensor weight_scale, Tensor? input_scale) -> Tensor")
def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
               input_scale: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) @ the fp8 (or int8) weight (N, K)^T with weight_scale (N, 1), x's dtype
    out: the GEMV at decode row counts it has a config for, else the scaled GEMM (the
    module's docstring). One opaque op, so that compiled graphs hold it as a node and the choice is
    made from each call's real row count (each CUDA graph size captures its own)."""
    x = x.contiguous()
    cfg = weight_config(x.shape[0], weight, x.dtype)
    if cfg is not None:
        return gemv(x, weight, weight_scale=weight_scale, config=cfg)
    return scaled_mm_linear(x, weight, weight_scale, input_scale)


@fp8_linear.register_fake
def _(x, weight, weight_scale, input_scale):
    return x.new_empty(x.shape[0], weight.shape[0])
