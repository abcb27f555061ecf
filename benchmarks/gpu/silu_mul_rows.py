"""loom.kernels.silu_mul.silu_mul alone at decode rows (Llama-3.1-8B's 2 x 14336 gate|up), in
a CUDA graph: what the down projection pays beside the plain GEMV where the SiLU-fused GEMV
is not taken (docs/performance.md, session 30: at 4 rows a fused split-4 GEMV took 31.68
against 31.21 us for the plain one, plus this)."""

import torch

from loom.bench.kernel_timing import KernelTimer
from loom.kernels.silu_mul import silu_mul

dev = torch.device("cuda")
timer = KernelTimer(dev, 3, 50)
timer.spin()
for m in (1, 2, 4, 8, 16):
    x = torch.randn(m, 2 * 14336, device=dev, dtype=torch.bfloat16)
    print(f"silu_mul rows {m}: {timer.time_us(lambda: silu_mul(x)):.2f} us")
