"""Residual add + RMSNorm (Llama-3.1-8B's hidden 4096, bf16) at decode and prompt-step row
counts: loom's kernel (`kernels/all_reduce_norm.add_rms_norm`, one program a row) against
the kernel Inductor fuses from the same reference (`layers/norm.fused_add_rms_norm`), as
microseconds and a fraction of the copy rate measured here (reads x, residual; writes two)."""

import torch

from loom.bench.ceilings import measure_ceilings
from loom.bench.kernel_timing import KernelTimer
from loom.kernels.all_reduce_norm import add_rms_norm
from loom.layers.norm import fused_add_rms_norm

dev = torch.device("cuda")
ceil = measure_ceilings(dev)
timer = KernelTimer(dev, 3, 20, fall_back_to_launches=True)
timer.spin()
n = 4096
w = torch.randn(n, device=dev, dtype=torch.bfloat16)
compiled = torch.compile(lambda x, r: fused_add_rms_norm(x, r, w, 1e-5), dynamic=False)
for m in (1, 8, 512, 2048, 16384):
    x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    r = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    floor_us = 4 * m * n * 2 / (ceil.copy_tb_per_s * 1e12) * 1e6
    ref = compiled(x, r)
    ours = add_rms_norm(x, r, w, 1e-5)
    diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(ref, ours))
    t_ind = timer.time_us(lambda: compiled(x, r))
    t_ours = timer.time_us(lambda: add_rms_norm(x, r, w, 1e-5))
    print(f"M={m:6d}: floor {floor_us:7.1f} us; inductor {t_ind:7.1f}; loom {t_ours:7.1f} "
          f"({t_ind / t_ours:.2f}x; max diff {diff:.3g})")
