"""The decode path of loom's GEMV (`kernels/gemv.py`): a table of configs measured to beat
cuBLAS per weight shape and row count (`benchmarks/gpu/gemv_bench.py --write-table`), the
plain `linear` that picks the GEMV or F.linear from it, and the opaque ops the decode GEMV
compile pass puts in graphs (`compilation/passes/decode_gemv.py`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging

import torch

from loom.kernels.all_reduce_norm import add_rms_norm
from loom.kernels.gemv import MAX_M, GemvConfig, add_rms_norm_gemv, gemv
from loom.kernels.silu_mul import silu_mul
from loom.kernels.tuned import config_dir, device_name
from loom.layers.norm import fused_add_rms_norm
from loom.library import loom_op

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
INT8 = torch.int8


def table_path(dtype: torch.dtype, gpu: str, kind: str = "gemv"):
    """Where the measured table of `kind` for weights of `dtype` on `gpu` is kept."""
    return config_dir() / f"{kind},dtype={str(dtype).removeprefix('torch.')},device_name={gpu}.json"


@functools.cache
def _table(dtype: torch.dtype, gpu: str,
           kind: str = "gemv") -> dict[tuple[int, int], dict[int, GemvConfig]]:
    """(N, K) -> {M: config} from loom/kernels/configs/{kind},dtype=...,device_name=....json;
    {} if none. kind "gemv": `benchmarks/gpu/gemv_bench.py`'s winners where they beat
    cuBLAS; "gemv_norm": `benchmarks/gpu/norm_gemv_probe.py`'s, the configs with which
    the GEMV that applies the residual add + RMSNorm itself beat the two kernels. A null
    config: cuBLAS (the two kernels, for "gemv_norm") at that row count, measured faster
    or not shown to gain end to end."""
    path = table_path(dtype, gpu, kind)
    if not path.is_file():
        if gpu != "cpu" and kind == "gemv" and dtype != torch.float8_e4m3fn:
            logger.info("decode GEMV: no measured table for %s (%s), so decode matmuls take "
                        "cuBLAS; benchmarks/gpu/gemv_bench.py --write-table measures one",
                        gpu, path)
        return {}
    raw = json.loads(path.read_text())
    try:
        return {tuple(int(v) for v in shape.split(",")): {
            int(m): None if c is None else GemvConfig(**c) for m, c in per_m.items()}
                for shape, per_m in raw.items()}
    except (TypeError, ValueError) as e:
        raise ValueError(f"gemv config file {path}: {e}") from None


def _at_or_above(per_m: dict[int, GemvConfig | None], m: int) -> GemvConfig | None:
    """The entry of the smallest measured row count >= m (None: none, or cuBLAS won)."""
    fits = [key for key in per_m if key >= m]
    return per_m[min(fits)] if fits else None


def tuned_config(m: int, n: int, k: int, dtype: torch.dtype,
                 device: torch.device) -> GemvConfig | None:
    """The measured config for this weight shape at the smallest measured row count >= m;
    None where nothing was measured there, or the entry is null (the caller then takes
    F.linear)."""
    per_m = _table(dtype, device_name(device)).get((n, k))
    return _at_or_above(per_m, m) if per_m else None


def weight_config(m: int, weight: torch.Tensor, x_dtype: torch.dtype) -> GemvConfig | None:
    """The GEMV's config for m rows of x_dtype times this weight (of x's dtype, or fp8 with
    its scale per row), or None (cuBLAS). fp8 weights take the fp8 table; where the GPU
    has none, the bf16 table's tile for the shape at twice its chunk width (the same bytes
    a chunk), logged once. int8 weights (as many bytes, also widened to x's dtype in the
    kernel) take fp8's tiles."""
    if not 1 <= m <= MAX_M or not weight.is_contiguous() \
            or weight.dtype not in (x_dtype, FP8, INT8):
        return None
    (n, k), device = weight.shape, weight.device
    if weight.dtype not in (FP8, INT8) or _has_fp8_table(device_name(device)):
        return tuned_config(m, n, k, FP8 if weight.dtype == INT8 else weight.dtype, device)
    cfg = tuned_config(m, n, k, torch.bfloat16, device)
    return None if cfg is None else dataclasses.replace(cfg, block_k=2 * cfg.block_k)


@functools.cache
def _has_fp8_table(gpu: str) -> bool:
    if table_path(FP8, gpu).is_file():
        return True
    logger.info("fp8 decode GEMV: no table measured for fp8 weights on %s; decode rows take "
                "the bf16 table's tiles at twice their chunk width (benchmarks/gpu/"
                "gemv_bench.py --weight-dtype fp8 --write-table measures one)", gpu)
    return False


def norm_config(m: int, weight: torch.Tensor, x_dtype: torch.dtype) -> GemvConfig | None:
    """The config with which `add_rms_norm_gemv` applies the add and norm itself for m rows
    of this weight, or None where the two kernels (add + norm, then the product) run. A
    shape of the "gemv_norm" table is decided by it (the smallest measured row count >= m;
    none: the two kernels). Elsewhere `weight_config`'s config where it reduces rows
    unsplit (with the tensor-core tiles the fused call lost 7-18 us on an H200: run_zzz25)."""
    if weight.dtype not in (x_dtype, FP8, INT8):
        return None
    per_m = _table(FP8 if weight.dtype == INT8 else weight.dtype, device_name(weight.device),
                   "gemv_norm").get(tuple(weight.shape))
    if per_m is not None:
        return _at_or_above(per_m, m)
    cfg = weight_config(m, weight, x_dtype)
    return cfg if cfg is not None and cfg.split_k == 1 and not cfg.use_dot else None


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight^T, by the Triton GEMV for batches of up to MAX_M rows where the table has
    a config for the shape (`tuned_config`), else by F.linear (cuBLAS)."""
    cfg = _gemv_config(x, weight)
    if cfg is not None:
        return gemv(x.contiguous(), weight, config=cfg)
    return torch.nn.functional.linear(x, weight)


def compile_linear(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Compile, without running, the GEMV that `linear(x, weight)` would launch (inside
    compile_pool, on its threads); False where linear takes cuBLAS (nothing to compile)."""
    cfg = _gemv_config(x, weight)
    if cfg is not None:
        gemv(x.contiguous(), weight, config=cfg, compile_only=True)
    return cfg is not None


def _gemv_config(x: torch.Tensor, weight: torch.Tensor) -> GemvConfig | None:
    return weight_config(x.shape[0], weight, x.dtype) if x.dtype == weight.dtype else None


def _product(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor | None,
             input_scale: torch.Tensor | None) -> torch.Tensor:
    """x @ weight^T as the layer computes it: `linear`, or for an fp8 weight (with its
    scale) `loom::fp8_linear`."""
    if weight_scale is None:
        return linear(x, weight)
    return torch.ops.loom.fp8_linear(x, weight, weight_scale, input_scale)


@loom_op("decode_linear", "(Tensor x, Tensor weight) -> Tensor")
def decode_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`linear` as one opaque op, so that the choice is made per call from the real row
    count: under CUDA graphs each decode size captures its own kernel, and no guard on the
    token count enters the graph."""
    return linear(x, weight)


@decode_linear.register_fake
def _(x, weight):
    return x.new_empty(x.shape[0], weight.shape[0])


@loom_op("decode_silu_mul_linear", "(Tensor x, Tensor weight, Tensor? weight_scale=None, "
         "Tensor? input_scale=None) -> Tensor")
def decode_silu_mul_linear(x: torch.Tensor, weight: torch.Tensor,
                           weight_scale: torch.Tensor | None = None,
                           input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """(silu(gate) * up) @ weight^T for x [M, 2K] = [gate | up]: an MLP's down projection
    with its activation. Where the down weight's measured config reduces rows (no tensor
    cores), the GEMV applies the activation as it reads x, so no SiLU·mul kernel runs
    before it. Otherwise the activation in one kernel (`silu_mul`, as Inductor would have
    fused it; torch's two eager ops on the CPU), then `linear`: with tensor-core tiles
    every program recomputes the activation for 16 padded rows, and 8B's down took ~45 us
    more a layer at batch 4 (run_zzz58; gemv_bench's SiLU rows at TP=2: 36.7 against
    17.8 us without the SiLU, 3485478). An fp8 weight comes with its scales, as
    `loom::fp8_linear` takes them; where no GEMV takes it, the rows are quantized as the
    activation is made (`fp8_linear.scaled_mm_linear(silu_mul_input=True)`)."""
    cfg = weight_config(x.shape[0], weight, x.dtype)
    if cfg is not None and not cfg.use_dot:
        return gemv(x.contiguous(), weight, silu_mul_input=True, weight_scale=weight_scale,
                    config=cfg)
    if x.is_cuda and weight_scale is not None and cfg is None:  # quantized as it is made
        from loom.kernels.fp8_linear import scaled_mm_linear
        return scaled_mm_linear(x.contiguous(), weight, weight_scale, input_scale,
                                silu_mul_input=True)
    if x.is_cuda:
        act = silu_mul(x.contiguous())
    else:
        gate, up = x.split(weight.shape[1], dim=-1)
        act = torch.nn.functional.silu(gate) * up
    return _product(act, weight, weight_scale, input_scale)


@decode_silu_mul_linear.register_fake
def _(x, weight, weight_scale=None, input_scale=None):
    return x.new_empty(x.shape[0], weight.shape[0])


@loom_op("decode_add_rms_norm_linear",
         "(Tensor x, Tensor residual, Tensor norm_weight, float eps, Tensor weight, "
         "Tensor? weight_scale=None, Tensor? input_scale=None) -> (Tensor, Tensor)")
def decode_add_rms_norm_linear(
        x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
        weight: torch.Tensor, weight_scale: torch.Tensor | None = None,
        input_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual) @ weight^T, x + residual): a decoder's residual add and norm
    with the projection that reads them (qkv, gate_up). Where `norm_config` has a config,
    the GEMV applies the add and the norm as it reads x (`add_rms_norm_gemv`): one kernel
    where Inductor's norm and the GEMV were two. Otherwise the add and norm in one kernel
    (torch's eager ops on the CPU), then `linear`. The decode GEMV pass puts this op in
    graphs at TP=1 unless LOOM_DECODE_NORM_GEMV=0 (`envs.py`). An fp8 weight comes with
    its scales, as `loom::fp8_linear` takes them; where its rows take the scaled GEMM (a
    prompt's), one kernel adds, normalises and quantizes them
    (`fp8_linear.add_rms_norm_scaled_mm_linear`)."""
    m = x.shape[0]
    if 1 <= m <= MAX_M and x.dtype == residual.dtype == norm_weight.dtype \
            and weight.is_contiguous() and norm_weight.is_contiguous():
        cfg = norm_config(m, weight, x.dtype)
        if cfg is not None:
            return add_rms_norm_gemv(x.contiguous(), residual.contiguous(), norm_weight, eps,
                                     weight, weight_scale=weight_scale, config=cfg)
    if x.is_cuda and weight_scale is not None and weight_config(m, weight, x.dtype) is None:
        # fp8 rows for the scaled GEMM: quantized by the add + norm kernel itself
        from loom.kernels.fp8_linear import add_rms_norm_scaled_mm_linear
        return add_rms_norm_scaled_mm_linear(x, residual, norm_weight, eps, weight,
                                             weight_scale, input_scale)
    if x.is_cuda:
        normed, residual_out = add_rms_norm(x, residual, norm_weight, eps)
    else:
        normed, residual_out = fused_add_rms_norm(x, residual, norm_weight, eps)
    return _product(normed, weight, weight_scale, input_scale), residual_out.contiguous()


@decode_add_rms_norm_linear.register_fake
def _(x, residual, norm_weight, eps, weight, weight_scale=None, input_scale=None):
    return x.new_empty(x.shape[0], weight.shape[0]), x.new_empty(x.shape)
