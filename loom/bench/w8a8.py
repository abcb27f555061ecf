"""`loom bench w8a8`: loom's int8 W8A8 linear layers (`loom::fp8_linear` with int8 weights,
loom/kernels/fp8_linear.py) on a model's projections, beside the fp8 layer and bf16's
matmul of the same shape, and the int8 GEMM's two forms apart.

For each projection of `--model` (qkv, o, gate_up and down, this rank's slice at TP) and
each row count M it draws a weight, quantizes it per channel to int8 and to fp8, draws
fresh activations, checks the op against the float32 product of the dequantized weight and
activations, and times as CUDA graph replays with L2 flushed before each (`KernelTimer`):

* `int8_us`: the whole op as a layer calls it (decode rows: the GEMV on the int8 weight;
  more rows: per-token int8 quantization, then `int8_gemm`);
* past the GEMV's rows, the two GEMMs alone on already quantized rows: `triton_us` (loom's
  Triton GEMM, scales in its epilogue) and `cublas_us` (`torch._int_mm` then one scaling
  pass), which decide which one the op takes;
* `fp8_us`: the same op with the fp8 weight; `bf16_us`: F.linear.

Decode rows are weight-bound: their floor is the int8 weight's bytes over the copy rate
measured in the same run. Prompt rows are compute-bound: their ceiling is cuBLAS's int8
GEMM rate at 8192^3 (`int8_matmul_tops`), also measured in the run.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from loom.bench.int4 import (DEFAULT_BATCH_SIZES, MAX_REL_ERROR, check_kernel_args, projections,
                             sweep, write_rows)


def register(subparsers) -> None:
    p = subparsers.add_parser("w8a8", help="time int8 W8A8 linear layers on a model's "
                              "projections beside fp8 and bf16", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b",
                   help="a shipped config name, a model directory or a config.json")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--batch-sizes", type=int, nargs="+",
                   default=list(DEFAULT_BATCH_SIZES) + [8192])
    p.add_argument("--num-iters-warmup", type=int, default=3)
    p.add_argument("--num-iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", default=None)
    p.set_defaults(func=run_w8a8)


def _row(name, shape, m, timer, gen, device) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from loom.kernels import fp8_linear as op  # registers loom::fp8_linear
    from loom.kernels.gemv_decode import weight_config
    from loom.kernels.int8_gemm import int8_gemm, int_mm_gemm
    from loom.quantization.fp8 import FP8, INT8, quantize_rows
    n, k = shape
    dense = (torch.randn(n, k, device=device, generator=gen) / k ** 0.5).to(torch.bfloat16)
    w8, s8 = quantize_rows(dense, INT8)
    wf8, sf8 = quantize_rows(dense, FP8)
    x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
    fp8_linear = torch.ops.loom.fp8_linear
    got = fp8_linear(x, w8, s8, None).float()
    want = x.float() @ (w8.float() * s8).t()
    err = float(((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-6)).max())
    if not err <= MAX_REL_ERROR:
        raise ValueError(f"w8a8: {name} M={m}: the op is {err:.3g} off the float32 product "
                         "(per row); not timing a wrong kernel")
    row = {"projection": name, "n": n, "k": k, "batch_size": m, "max_rel_error": err,
           "gemv": weight_config(m, w8, x.dtype) is not None,
           "int8_us": timer.time_us(lambda: fp8_linear(x, w8, s8, None)),
           "fp8_us": timer.time_us(lambda: fp8_linear(x, wf8, sf8, None)),
           "bf16_us": timer.time_us(lambda: F.linear(x, dense))}
    if not row["gemv"]:
        xq, xs = op.quantize_rows(x, dtype=INT8)
        row["quantize_us"] = timer.time_us(lambda: op.quantize_rows(x, dtype=INT8))
        row["triton_us"] = timer.time_us(lambda: int8_gemm(xq, xs, w8, s8, x.dtype))
        row["cublas_us"] = timer.time_us(lambda: int_mm_gemm(xq, xs, w8, s8, x.dtype))
    row["weight_bytes"] = w8.numel() + s8.numel() * 4
    row["gbps"] = row["weight_bytes"] / row["int8_us"] / 1e3
    row["tops"] = 2 * m * n * k / row["int8_us"] / 1e6
    return row


def run_w8a8(args: argparse.Namespace) -> int:
    from loom.bench.moe_space import model_config_json
    shapes = projections(model_config_json(args.model), args.tensor_parallel_size)
    sizes = check_kernel_args(args, "w8a8")
    import torch

    from loom.bench.ceilings import measure_ceilings
    device = torch.device("cuda", torch.cuda.current_device())
    ceilings = measure_ceilings(device, fp8=True, int8=True)
    name = torch.cuda.get_device_name(device)
    print(f"{name}: {args.model} TP {args.tensor_parallel_size}; copy "
          f"{ceilings.copy_tb_per_s:.2f} TB/s, bf16 matmul {ceilings.matmul_tflop_per_s:.0f} "
          f"TFLOP/s, fp8 {ceilings.fp8_matmul_tflop_per_s:.0f} TFLOP/s, int8 "
          f"{ceilings.int8_matmul_tops:.0f} TOPS", flush=True)
    rows, started = [], time.perf_counter()
    for proj, shape, m, timer, gen in sweep(shapes, sizes, device, args):
        row = _row(proj, shape, m, timer, gen, device)
        row["fraction_of_copy"] = row["gbps"] / (ceilings.copy_tb_per_s * 1e3)
        row["fraction_of_int8"] = row["tops"] / ceilings.int8_matmul_tops
        rows.append(row)
        gemms = ("" if row["gemv"] else f"  quant {row['quantize_us']:.1f} triton "
                 f"{row['triton_us']:.1f} cublas {row['cublas_us']:.1f}")
        print(f"{proj:>13} {shape[0]:>6}x{shape[1]:<6} M={m:>5}  int8 {row['int8_us']:>8.1f}"
              f" us ({row['fraction_of_copy']:.2f} of copy, {row['fraction_of_int8']:.2f} "
              f"of int8)  fp8 {row['fp8_us']:>8.1f}  bf16 {row['bf16_us']:>8.1f}{gemms}",
              flush=True)
    write_rows(args, "w8a8", name, ceilings, started, rows)
    return 0
