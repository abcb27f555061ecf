"""Throughput's prompt steps attend over whole fresh prompts (B prompts of L tokens beside
the decodes): loom's varlen paged prefill kernel against torch's `varlen_attn` (its flash
kernel, cu_seqlens over contiguous keys) and cuDNN's SDPA, per prompt (what the backend
runs for <= 4 requests) and batched dense (an upper bound: equal lengths only).

One layer, timed alone (KernelTimer: CUDA graph, L2 flushed), each output checked against
loom's kernel. Prints microseconds and TFLOP/s (causal: 2 * 2 * H * D * L * (L + 1) / 2 per
prompt).

    python3 attn_varlen_probe.py OUT.json
"""
import json
import sys

import torch
import torch.nn.functional as F

from loom.attention.triton_backend import sdpa_causal
from loom.bench.kernel_timing import KernelTimer
from loom.kernels.paged_attention import paged_prefill

dev = torch.device("cuda")
timer = KernelTimer(dev, warmup=3, iters=20, fall_back_to_launches=True)
timer.spin(1.0)
try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError as e:
    varlen_attn = None
    print(f"no varlen_attn in torch {torch.__version__}: {e}")
rows = []
for name, H, KH, B, L in (("8b", 32, 8, 16, 1024), ("8b", 32, 8, 8, 2048), ("8b", 32, 8, 32, 512),
                          ("qwen3", 32, 4, 16, 1024)):
    D, T = 128, B * L
    scale = D ** -0.5
    torch.manual_seed(0)
    q = torch.randn(T, H, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(T, KH, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(T, KH, D, device=dev, dtype=torch.bfloat16)
    cache = torch.stack([k, v]).view(2, T // 16, 16, KH, D)
    table = torch.arange(T // 16, device=dev, dtype=torch.int32).view(B, L // 16)
    qsl = torch.arange(0, T + 1, L, device=dev, dtype=torch.int32)
    lens = torch.full((B,), L, device=dev, dtype=torch.int32)
    out = torch.empty_like(q)
    flops = B * 2 * 2 * H * D * L * (L + 1) / 2

    def loom():
        return paged_prefill(q, cache, out, table, qsl, lens, B, L, scale, block_m=128,
                             block_n=64, num_warps=4, num_stages=3)

    qd, kd, vd = (t.view(B, L, -1, D).transpose(1, 2).contiguous() for t in (q, k, v))

    def dense():
        return F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale,
                                              enable_gqa=True).transpose(1, 2).reshape(T, H, D)

    def per_prompt():
        return torch.cat([sdpa_causal(q[i * L:(i + 1) * L], k[i * L:(i + 1) * L],
                                      v[i * L:(i + 1) * L], scale) for i in range(B)])

    variants = {"loom paged_prefill": loom, "SDPA per prompt": per_prompt,
                "SDPA dense batch": dense}
    if varlen_attn is not None:
        def varlen():
            return varlen_attn(q, k, v, qsl, qsl, L, L, scale=scale,
                               window_size=(-1, 0), enable_gqa=True)
        variants["torch varlen_attn"] = varlen
    ref = loom().float().clone()
    for vname, fn in variants.items():
        try:
            got = fn().float()
            err = ((got - ref).abs().max() / ref.abs().max()).item()
            us = timer.time_us(fn)
        except Exception as e:  # noqa: BLE001
            print(f"{name} B={B} L={L} {vname}: {type(e).__name__}: {str(e)[:160]}")
            continue
        tf = flops / us / 1e6
        print(f"{name} B={B} L={L} {vname:20s} {us:8.1f} us {tf:6.1f} TFLOP/s  err {err:.2e}"
              f"  ({timer.method})", flush=True)
        rows.append({"shape": name, "B": B, "L": L, "H": H, "KH": KH, "variant": vname,
                     "us": us, "tflops": tf, "max_rel_err": err})
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
          open(sys.argv[1], "w"), indent=1)
