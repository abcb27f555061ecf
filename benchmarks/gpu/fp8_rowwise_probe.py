"""Per-channel fp8 (what `--quantization fp8` runs: torch._scaled_mm row-wise) at
Llama-3.1-8B's projection shapes, split into its parts: the GEMM alone on inputs already
quantized, the per-token quantization compiled (one fused kernel, as Inductor makes it
inside loom's compiled graphs) and eager (five kernels), beside bf16 F.linear and the
block-wise op (`loom::fp8_block_linear`, 128 x 128 blocks, its quantization included).
Prints microseconds per call (CUDA-graph replays) and TFLOP/s at 8192 rows; asserts
nothing."""

import torch
import torch.nn.functional as F

from loom.bench.kernel_timing import KernelTimer
from loom.kernels.fp8_block_gemm import fp8_block_linear
from loom.quantization.fp8 import quantize_rows
from loom.quantization.fp8_block import quantize_blocks

dev = torch.device("cuda")
timer = KernelTimer(dev, 3, 20, fall_back_to_launches=True)
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
          "down": (4096, 14336)}
compiled_quant = torch.compile(quantize_rows, dynamic=False)


def row_for(name, n, k, m, w):
    wr, wrs = quantize_rows(w)
    wb = w.bfloat16()
    bq, bs = quantize_blocks(w, (128, 128))
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    xq, xs = quantize_rows(x)
    calls = {
        "bf16": lambda: F.linear(x, wb),
        "rowwise_gemm": lambda: torch._scaled_mm(xq, wr.t(), scale_a=xs, scale_b=wrs.t(),
                                                 out_dtype=torch.bfloat16),
        "quant_compiled": lambda: compiled_quant(x),
        "quant_eager": lambda: quantize_rows(x),
        "block_op": lambda: fp8_block_linear(x, bq, bs, 128, 128),
    }
    out = [f"{name} N={n} K={k} M={m}:"]
    for label, fn in calls.items():
        us = timer.time_us(fn)
        rate = f" {2 * m * n * k / us / 1e6:.0f}TF" if m >= 1024 and "quant" not in label else ""
        out.append(f"{label} {us:.1f}us{rate};")
    print(" ".join(out), flush=True)


def main():
    print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
    timer.spin()
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev) / k ** 0.5
        for m in (1, 8, 64, 1024, 8192):
            row_for(name, n, k, m, w)


if __name__ == "__main__":
    main()
