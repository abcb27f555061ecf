"""Residual add + RMSNorm read by the GEMV (`kernels/gemv.add_rms_norm_gemv`) against the
two kernels it replaces at decode (Inductor's fused add + norm, then loom's GEMV with the
same measured config), for Llama-3.1-8B's qkv and gate_up and one TP=2 rank's, at 1-8
rows. Each variant is one CUDA graph replayed after an L2 flush (loom.bench.kernel_timing),
so the idle between the two kernels counts. The floor is the weight's bytes over the copy
rate measured here. Usage: python3 benchmarks/gpu/norm_gemv_probe.py OUT.json"""

import json
import sys

import torch

from loom.bench.ceilings import measure_ceilings
from loom.bench.common import git_commit, now_iso
from loom.bench.kernel_timing import KernelTimer
from loom.kernels.gemv import add_rms_norm_gemv, gemv
from loom.kernels.gemv_decode import tuned_config
from loom.layers.norm import fused_add_rms_norm

dev = torch.device("cuda")
ceil = measure_ceilings(dev)
timer = KernelTimer(dev, 3, 30)
timer.spin()
dtype, eps, k = torch.bfloat16, 1e-5, 4096
nw = (1 + 0.1 * torch.randn(k, device=dev)).to(dtype)
norm = torch.compile(lambda x, r: fused_add_rms_norm(x, r, nw, eps), dynamic=False)
rows = []
for name, n in (("8b qkv", 6144), ("8b gate_up", 28672), ("rank qkv", 3072),
                ("rank gate_up", 14336)):
    w = torch.randn(n, k, device=dev, dtype=dtype) / k ** 0.5
    floor_us = n * k * 2 / (ceil.copy_tb_per_s * 1e12) * 1e6
    for m in (1, 2, 4, 8):
        cfg = tuned_config(m, n, k, dtype, dev)
        if cfg is None:
            print(f"{name} M={m}: no measured config (cuBLAS there)")
            continue
        x = torch.randn(m, k, device=dev, dtype=dtype)
        r = torch.randn(m, k, device=dev, dtype=dtype)

        def separate():
            normed, res = norm(x, r)
            return gemv(normed, w, config=cfg), res

        def fused():
            return add_rms_norm_gemv(x, r, nw, eps, w, config=cfg)

        (y0, r0), (y1, r1) = separate(), fused()
        diff = float((y0.float() - y1.float()).abs().max() / y0.float().abs().max())
        same_res = bool(torch.equal(r0, r1))
        t_sep, t_fused = timer.time_us(separate), timer.time_us(fused)
        row = dict(shape=name, n=n, k=k, m=m, config=cfg.describe(), floor_us=floor_us,
                   separate_us=t_sep, fused_us=t_fused, rel_diff=diff, residual_equal=same_res)
        rows.append(row)
        print(f"{name:13s} M={m}: floor {floor_us:6.1f} us; norm + gemv {t_sep:6.1f}; "
              f"fused {t_fused:6.1f} ({t_sep - t_fused:+.1f} us; floor/fused "
              f"{floor_us / t_fused:.2f}); rel diff {diff:.2g}, residual equal {same_res}")
json.dump({"benchmark": "norm-gemv-probe", "date": now_iso(), "git_commit": git_commit(),
           "device": torch.cuda.get_device_name(dev), "command": " ".join(sys.argv),
           "ceilings": vars(ceil), "timing": timer.method, "rows": rows},
          open(sys.argv[1], "w"), indent=1)
