"""Why prompt steps' GEMMs run at ~84% of the matmul ceiling when an 8192-token prefill's
run at ~95%. Two suspects, each measured here:

1. The row count. A throughput prompt step has 16384 prompt tokens plus its ~440 decodes
   (16824 rows, say), not a round number; cuBLAS's choice of kernel and its last tile row
   depend on it. Llama-3.1-8B's four weight shapes at 8192, 16384, 16824 and 16896 rows
   (the next multiple of 256), in TFLOP/s (CUDA graphs, median of replays).
2. The clocks. The ceiling is the best of five short bursts; a throughput run keeps the
   tensor cores busy for 40 s. The 8192^3 matmul back to back for --seconds, its rate per
   second of the run, beside the SM clock nvidia-smi reports (read only).

`--rows 484 512 --seconds 0 --max-autotune` asks the decode steps' question instead (their
GEMMs ran at ~61% of the ceiling at ~484 rows padded to 512): the same four shapes, and
beside cuBLAS the GEMM Inductor's max-autotune picks for that one shape (cuBLAS or a Triton
template, whichever it timed faster).
"""
import argparse
import subprocess
import time

import torch

from loom.bench.ceilings import measure_ceilings
from loom.bench.kernel_timing import KernelTimer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seconds", type=float, default=20.0, help="0: skip the held matmul")
parser.add_argument("--rows", type=int, nargs="+", default=[8192, 16384, 16824, 16896])
parser.add_argument("--max-autotune", action="store_true")
args = parser.parse_args()
dev = torch.device("cuda")
ceil = measure_ceilings(dev)
print(f"ceilings: copy {ceil.copy_tb_per_s:.3f} TB/s, matmul {ceil.matmul_tflop_per_s:.1f} TFLOP/s")
timer = KernelTimer(dev, 2, 10)
timer.spin()
shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
weights = {k: torch.randn(n, kk, device=dev, dtype=torch.bfloat16) / 64 for k, (n, kk) in shapes.items()}


def linear(x, w):
    return torch.nn.functional.linear(x, w)


variants = {"cuBLAS": linear}
if args.max_autotune:
    torch._dynamo.config.cache_size_limit = 64  # one graph per shape and row count
    variants["max-autotune"] = torch.compile(linear, mode="max-autotune-no-cudagraphs",
                                             dynamic=False)
for m in args.rows:
    for label, fn in variants.items():
        row = []
        total_flops = total_us = 0.0
        for name, w in weights.items():
            x = torch.randn(m, w.shape[1], device=dev, dtype=torch.bfloat16)
            fn(x, w)  # compiles (and autotunes) outside the timer
            us = timer.time_us(lambda: fn(x, w))
            flops = 2 * m * w.shape[0] * w.shape[1]
            total_flops += flops
            total_us += us
            row.append(f"{name} {flops / us / 1e6:6.1f}")
        print(f"M={m:6d} {label}: " + ", ".join(row) + f" TFLOP/s; a layer "
              f"{total_flops / total_us / 1e6:.1f} "
              f"({total_flops / total_us / 1e6 / ceil.matmul_tflop_per_s:.1%} of the ceiling, "
              f"{total_us:.0f} us)", flush=True)


def sm_clock() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                               "--format=csv,noheader", "-i", str(dev.index or 0)],
                              capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


if args.seconds <= 0:
    raise SystemExit(0)
n = 8192
a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
start = time.perf_counter()
while time.perf_counter() - start < args.seconds:
    t0 = time.perf_counter()
    calls = 0
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    while time.perf_counter() - t0 < 1.0:
        for _ in range(20):
            a @ b
        calls += 20
        torch.cuda.synchronize(dev)
    e1.record()
    torch.cuda.synchronize(dev)
    rate = calls * 2 * n ** 3 / (e0.elapsed_time(e1) / 1e3) / 1e12
    print(f"t={time.perf_counter() - start:5.1f} s: {rate:6.1f} TFLOP/s "
          f"({rate / ceil.matmul_tflop_per_s:.1%}); sm clock, power, temp: {sm_clock()}")
