"""What a new sequence length costs PyTorch's SDPA: causal GQA attention (32 query heads,
8 KV, head dim 128, bf16, batch 1: a fresh prompt on the SDPA path), each length's first
call and its second, with the default backend choice and with cuDNN / flash forced; then
each backend's rate at 8192 tokens against the matmul ceiling measured here.

run_zzs: with no Triton compile at all, each fresh prompt size's first one-prompt step took
~55-60 ms longer than its second, whatever the size (333 to 12011 tokens).

    python3 sdpa_shape_probe.py [--json OUT]
"""
import argparse
import dataclasses
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, ".")
from loom.bench.ceilings import measure_ceilings  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--json", default=None)
args = parser.parse_args()
dev = torch.device("cuda")
ceil = measure_ceilings(dev)
result = {"ceilings": dataclasses.asdict(ceil), "first_calls": [], "rates": []}
backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "flash": SDPBackend.FLASH_ATTENTION}


def inputs(length):
    q = torch.randn(1, 32, length, 128, device=dev, dtype=torch.bfloat16)
    k = torch.randn(1, 8, length, 128, device=dev, dtype=torch.bfloat16)
    return q, k, torch.randn_like(k)


def attend(qkv, backend):
    ctx = sdpa_kernel(backend) if backend is not None else torch.autocast("cuda", enabled=False)
    with ctx:
        return F.scaled_dot_product_attention(*qkv, is_causal=True, enable_gqa=True)


lens = [333, 777, 1501, 3001, 6007, 8192]
for j, (name, backend) in enumerate(backends.items()):
    for i, length in enumerate(lens):
        # odd and even lengths, and none another backend has seen (a cache would hide it)
        row = {"backend": name, "tokens": length + i % 2 + 4 * j}
        qkv = inputs(row["tokens"])
        for call in ("first_ms", "second_ms"):
            torch.cuda.synchronize()
            t = time.perf_counter()
            attend(qkv, backend)
            torch.cuda.synchronize()
            row[call] = 1e3 * (time.perf_counter() - t)
        result["first_calls"].append(row)
        print(f"{name:8s} {row['tokens']:6d} tokens: first {row['first_ms']:7.1f} ms, "
              f"second {row['second_ms']:6.2f} ms", flush=True)
for name, backend in backends.items():
    for length in (1024, 8192):
        qkv = inputs(length)
        attend(qkv, backend)
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            attend(qkv, backend)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / 20
        flops = 4 * 32 * 128 * length * length / 2
        rate = flops / ms / 1e9
        result["rates"].append({"backend": name, "tokens": length, "ms": ms, "tflops": rate})
        print(f"{name:8s} {length} tokens: {ms:.3f} ms, {rate:.0f} TFLOP/s "
              f"({rate / ceil.matmul_tflop_per_s:.1%} of the ceiling)",
              flush=True)
if args.json:
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
