"""`loom bench int4`: loom's W4A16 linear kernel (`loom::int4_linear`,
loom/kernels/int4_linear.py) on a model's projections, beside torch's bf16 matmul of the
same shape; `--bits 8` its W8A16 form (GPTQ-Int8's and compressed-tensors' W8A16
weights, packed four to an int32 word).

For each projection of `--model` (qkv, o, gate_up and down, this rank's slice at TP) and
each row count M it draws a random int4 (8-bit) weight (a scale per `--group-size` input
features, zero points unless --symmetric) and fresh activations, checks the kernel against
the dequantized weight's float32 product, and times both calls as CUDA graph replays with
L2 flushed before each (`KernelTimer`). It prints the microseconds, the bandwidth over the
weight's bytes (values: half a byte each, or one; scales and zero points) as a fraction of
the copy rate measured in the same run (the floor of a weight-bound call), and the bf16
matmul's time for the same shape: decode rows should approach the copy rate and run ~3.5x
faster than bf16 (a quarter of the bytes; 8 bits: ~1.9x, a half); prompt rows are
compute-bound, where bf16's tensor-core rate is the peer.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from typing import Any

from loom.bench.common import command_line, git_commit, now_iso, write_json

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 64, 256, 1024, 4096)
MAX_REL_ERROR = 2e-2
"""Per-row error against the float32 product: bf16 rounding of the output gives ~0.4%."""


def register(subparsers) -> None:
    p = subparsers.add_parser("int4", help="time the W4A16 int4 (--bits 8: W8A16) linear "
                              "kernel on a model's projections beside bf16",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b",
                   help="a shipped config name, a model directory or a config.json")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    p.add_argument("--group-size", type=int, default=128,
                   help="input features per scale; -1: a scale per output channel")
    p.add_argument("--symmetric", action="store_true", help="no zero points (GPTQ's)")
    p.add_argument("--bits", type=int, default=4, choices=(4, 8),
                   help="the weights' width: 4 (W4A16) or 8 (W8A16: GPTQ-Int8, "
                        "compressed-tensors' W8A16)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(DEFAULT_BATCH_SIZES))
    p.add_argument("--num-iters-warmup", type=int, default=3)
    p.add_argument("--num-iters", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", default=None)
    p.set_defaults(func=run_int4)


def projections(hf: dict[str, Any], tp: int) -> dict[str, tuple[int, int]]:
    """name -> (out, in) of this rank's slice of each projection."""
    hf = hf.get("text_config", hf)
    h, inter = int(hf["hidden_size"]), int(hf["intermediate_size"])
    heads = int(hf["num_attention_heads"])
    kv = int(hf.get("num_key_value_heads", heads))
    hd = int(hf.get("head_dim") or h // heads)
    for what, n in (("attention heads", heads), ("intermediate size", inter)):
        if n % tp:
            raise ValueError(f"tensor_parallel_size: {tp} does not divide the {what} ({n})")
    kv_rank = max(kv // tp, 1)
    return {"qkv_proj": ((heads // tp + 2 * kv_rank) * hd, h), "o_proj": (h, heads * hd // tp),
            "gate_up_proj": (2 * inter // tp, h), "down_proj": (h, inter // tp)}


def check_kernel_args(args: argparse.Namespace, bench: str) -> list[int]:
    """A kernel benchmark's common arguments checked, and a GPU that runs Triton's compiled
    kernels; the distinct row counts."""
    sizes = list(dict.fromkeys(args.batch_sizes))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"batch_sizes: must be positive, got {args.batch_sizes}")
    if args.num_iters < 1 or args.num_iters_warmup < 0:
        raise ValueError("num_iters must be positive and num_iters_warmup >= 0")
    import torch
    if not torch.cuda.is_available():
        raise ValueError(f"{bench}: needs a CUDA GPU (it times Triton kernels); torch sees "
                         "none here")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise ValueError(f"{bench}: TRITON_INTERPRET is set: the kernels would run on the "
                         "CPU interpreter; unset it")
    return sizes


def _weight(n: int, k: int, group: int, symmetric: bool, device, gen, bits: int = 4):
    """Random words (every value 0 .. 2^bits - 1 alike), scales 1e-3 .. 3e-3 (8 bits:
    sixteen times smaller, for values sixteen times wider) and zero points."""
    import torch
    packed = torch.randint(-2 ** 31, 2 ** 31 - 1, (n, k * bits // 32), dtype=torch.int32,
                           device=device, generator=gen)
    scale = (torch.rand(n, k // group, device=device, generator=gen) * 2e-3 + 1e-3)
    scale = scale / (1 << (bits - 4))
    zero = None if symmetric else torch.randint(0, 1 << bits, (n, k // group),
                                                dtype=torch.uint8, device=device,
                                                generator=gen)
    return packed, scale.to(torch.bfloat16), zero


def _row(name, shape, m, timer, args, gen, device) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from loom.kernels import int4_linear as kernel
    from loom.quantization.int4 import dequantize
    n, k = shape
    group = k if args.group_size == -1 else args.group_size
    bits = args.bits
    packed, scale, zero = _weight(n, k, group, args.symmetric, device, gen, bits)
    x = torch.randn(m, k, device=device, generator=gen).to(torch.bfloat16)
    dense = dequantize(packed, scale, zero, group, bits)
    want = x.float() @ dense.t()
    got = kernel.int4_linear(x, packed, scale, zero, group, bits).float()
    err = float(((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-6)).max())
    if not err <= MAX_REL_ERROR:
        raise ValueError(f"int4: {name} M={m}: the kernel is {err:.3g} off the float32 "
                         "product (per row); not timing a wrong kernel")
    dense = dense.to(torch.bfloat16)
    us = timer.time_us(lambda: kernel.int4_linear(x, packed, scale, zero, group, bits))
    bf16_us = timer.time_us(lambda: F.linear(x, dense))
    nbytes = packed.numel() * 4 + scale.numel() * 2 + (0 if zero is None else zero.numel())
    # The op's regime for m rows: the GEMV, the tensor-core tile, or past the decode rows
    # the weight dequantized and the dense GEMM.
    from loom.kernels import int4_gemv
    sms = kernel.sm_count(x.device) if x.is_cuda else 132
    if m <= kernel.GEMV_ROWS:
        config = {"kernel": "int4_gemv", **dataclasses.asdict(int4_gemv.default_config(
            m, n, k, group, kernel.block_k_for(group), sms, bits, x.is_cuda))}
    elif m <= kernel.DECODE_ROWS:
        config = {"kernel": "int4_matmul",
                  **dataclasses.asdict(kernel.default_config(m, n, k, group, sms, bits))}
    else:
        config = "dequantize + dense GEMM"
    return {"projection": name, "n": n, "k": k, "bits": bits, "batch_size": m, "us": us,
            "bf16_us": bf16_us,
            "weight_bytes": nbytes, "gbps": nbytes / us / 1e3, "config": config,
            "max_rel_error": err}


def sweep(shapes: dict[str, tuple[int, int]], sizes: list[int], device, args):
    """(projection, shape, row count, timer, generator) for each projection and row count
    of a kernel benchmark, the GPU's clocks brought up before each."""
    import torch

    from loom.bench.kernel_timing import KernelTimer
    timer = KernelTimer(device, args.num_iters_warmup, args.num_iters)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    for proj, shape in shapes.items():
        for m in sizes:
            timer.spin()
            yield proj, shape, m, timer, gen


def write_rows(args: argparse.Namespace, bench: str, device: str, ceilings, started: float,
               rows: list[dict], **extra) -> None:
    """A kernel benchmark's --output-json: provenance, ceilings, its settings, the rows."""
    if not args.output_json:
        return
    payload = {"benchmark": bench, "date": now_iso(), "git_commit": git_commit(),
               "command": command_line(), "device": device,
               "ceilings": dataclasses.asdict(ceilings), "model": args.model,
               "tensor_parallel_size": args.tensor_parallel_size, **extra,
               "elapsed_s": time.perf_counter() - started, "rows": rows}
    print(f"Wrote {write_json(args.output_json, payload)}")


def run_int4(args: argparse.Namespace) -> int:
    from loom.bench.moe_space import model_config_json
    shapes = projections(model_config_json(args.model), args.tensor_parallel_size)
    if args.group_size != -1 and (args.group_size < 16 or args.group_size % 16):
        raise ValueError(f"group_size: {args.group_size} is not -1 or a multiple of 16")
    sizes = check_kernel_args(args, "int4")
    import torch

    from loom.bench.ceilings import measure_ceilings
    device = torch.device("cuda", torch.cuda.current_device())
    ceilings = measure_ceilings(device)
    copy_gbps = ceilings.copy_tb_per_s * 1e3
    name = torch.cuda.get_device_name(device)
    print(f"{name}: {args.model} TP {args.tensor_parallel_size}, {args.bits}-bit weights "
          f"in groups of {args.group_size}"
          f"{', symmetric' if args.symmetric else ', zero points'}; copy "
          f"{ceilings.copy_tb_per_s:.2f} TB/s, bf16 matmul {ceilings.matmul_tflop_per_s:.0f} "
          "TFLOP/s", flush=True)
    rows, started = [], time.perf_counter()
    for proj, shape, m, timer, gen in sweep(shapes, sizes, device, args):
        row = _row(proj, shape, m, timer, args, gen, device)
        row["fraction_of_copy"] = row["gbps"] / copy_gbps
        rows.append(row)
        print(f"{proj:>13} {shape[0]:>6}x{shape[1]:<6} M={m:>5}  {row['us']:>8.1f} us "
              f"({row['gbps']:>5.0f} GB/s, {row['fraction_of_copy']:.2f} of copy)  bf16 "
              f"{row['bf16_us']:>8.1f} us  x{row['bf16_us'] / row['us']:.2f}", flush=True)
    write_rows(args, "int4", name, ceilings, started, rows, group_size=args.group_size,
               symmetric=args.symmetric, bits=args.bits)
    return 0
