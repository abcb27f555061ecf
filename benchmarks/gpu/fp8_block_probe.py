"""Block-wise fp8 linear layers at Qwen3-8B's projection shapes (TP=1, 128 x 128 blocks):
`loom::fp8_block_linear` (the activations' per-group quantization, then cuBLASLt's block-wise
scaled_mm on sm_90) and the same quantization with loom's Triton GEMM in a few tile configs,
against bf16 F.linear (cuBLAS) and the per-channel fp8 matmul (`torch._scaled_mm` row-wise,
its quantization unfused here). Prints microseconds per call (CUDA-graph replays), TFLOP/s
at prompt sizes and each path's largest difference from the op's output; asserts nothing."""

import torch
import torch.nn.functional as F

from loom.bench.kernel_timing import KernelTimer
from loom.kernels.fp8_block_gemm import (BlockGemmConfig, block_gemm, default_config,
                                         fp8_block_linear, quantize_groups)
from loom.quantization.fp8 import quantize_rows
from loom.quantization.fp8_block import quantize_blocks

dev = torch.device("cuda")
timer = KernelTimer(dev, 3, 20, fall_back_to_launches=True)
SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096),
          "down": (4096, 12288)}
SWEEP = {  # rows -> Triton tiles tried beside the default
    1: [BlockGemmConfig(16, 32, 128, 4, 4), BlockGemmConfig(16, 16, 128, 4, 4)],
    16: [BlockGemmConfig(16, 32, 128, 4, 4), BlockGemmConfig(16, 128, 128, 4, 4)],
    128: [BlockGemmConfig(64, 64, 128, 4, 4), BlockGemmConfig(64, 128, 128, 4, 4)],
    8192: [BlockGemmConfig(128, 256, 128, 8, 3), BlockGemmConfig(128, 128, 128, 8, 4),
           BlockGemmConfig(128, 128, 128, 4, 4), BlockGemmConfig(64, 256, 128, 8, 3)],
}


def rowwise(x, wq, ws):
    xq, xs = quantize_rows(x)
    return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws.t(), out_dtype=torch.bfloat16)


def triton_path(x, wq, ws, cfg):
    xq, xs = quantize_groups(x, 128)
    return block_gemm(xq, xs, wq, ws, (128, 128), torch.bfloat16, cfg)


def row_for(name, n, k, m, w):
    wq, ws = quantize_blocks(w, (128, 128))
    wb, (wr, wrs) = w.bfloat16(), quantize_rows(w)
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    ours = fp8_block_linear(x, wq, ws, 128, 128)
    calls = {"op": lambda: fp8_block_linear(x, wq, ws, 128, 128),
             "bf16": lambda: F.linear(x, wb), "rowwise": lambda: rowwise(x, wr, wrs),
             "quant": lambda: quantize_groups(x, 128)}
    for cfg in [default_config(m, 128), *SWEEP.get(m, [])]:
        calls[f"triton {cfg.block_m}x{cfg.block_n} w{cfg.num_warps}s{cfg.num_stages}"] = \
            (lambda c: lambda: triton_path(x, wq, ws, c))(cfg)
    out = [f"{name} N={n} K={k} M={m}:"]
    for label, fn in calls.items():
        diff = "" if label in ("bf16", "rowwise", "quant") else \
            f" d{(fn().float() - ours.float()).abs().max().item():.2g}"
        us = timer.time_us(fn)
        rate = f" {2 * m * n * k / us / 1e6:.0f}TF" if m >= 1024 else ""
        out.append(f"{label} {us:.1f}us{rate}{diff};")
    print(" ".join(out), flush=True)


def main():
    print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())
    timer.spin()
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=dev) / k ** 0.5
        for m in (1, 16, 128, 1024, 8192):
            row_for(name, n, k, m, w)


if __name__ == "__main__":
    main()
