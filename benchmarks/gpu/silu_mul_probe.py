"""The down projection's activation at prompt-step sizes (16384 x 2 x 14336 bf16, Llama-3.1-8B
at 16384 batched tokens): loom.kernels.gemv.silu_mul's kernel over a few tiles against the
kernel Inductor fuses for silu(gate) * up, as a fraction of the copy rate measured here."""

import torch
import torch.nn.functional as F
import triton

from loom.bench.ceilings import measure_ceilings
from loom.bench.kernel_timing import KernelTimer
from loom.kernels.gemv import _silu_mul_kernel

dev = torch.device("cuda")
ceil = measure_ceilings(dev)
timer = KernelTimer(dev, 3, 20, fall_back_to_launches=True)
timer.spin()
for m in (512, 16384):
    k = 14336
    x = torch.randn(m, 2 * k, device=dev, dtype=torch.bfloat16)
    out = torch.empty(m, k, device=dev, dtype=torch.bfloat16)
    floor_us = 3 * m * k * 2 / (ceil.copy_tb_per_s * 1e12) * 1e6
    compiled = torch.compile(lambda t: F.silu(t[:, :k]) * t[:, k:])
    ref = compiled(x)
    print(f"M={m}: floor {floor_us:.1f} us; inductor {timer.time_us(lambda: compiled(x)):.1f} us")
    for block in (1024, 2048, 4096):
        for warps in (4, 8):
            def call():
                _silu_mul_kernel[(m, triton.cdiv(k, block))](x, out, k, x.stride(0),
                                                              out.stride(0), BLOCK=block,
                                                              num_warps=warps)
            call()
            err = float((out.float() - ref.float()).abs().max())
            print(f"  block {block} warps {warps}: {timer.time_us(call):.1f} us (max diff {err:.3g})")
