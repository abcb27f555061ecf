"""Does a large decode step gain from running two halves of its batch on two streams?

Throughput's decode-only steps (~484 requests of ~1150 tokens on 8B) spend ~57% of their
time in decode attention, which reads the KV cache at the copy rate, and most of the rest in
GEMMs at ~484 rows, which are near compute-bound. They run one after the other. Split the
batch in two and let each half's layer chain run on its own stream: while one half reads its
KV cache the other can run its GEMMs, at the price of reading every weight twice.

One 8B-shaped layer chain (qkv GEMM -> paged decode attention -> o GEMM + residual ->
gate_up GEMM -> SiLU*mul -> down GEMM), no norms or rotary, LAYERS distinct layers over one
shared KV cache, each variant captured in one CUDA graph (KernelTimer: L2 flushed, median):
  seq        the whole batch, one stream (what loom runs now)
  halves     two halves one after the other on one stream (the split's own cost)
  2streams   the two halves on two streams, nothing shared between them
plus attention alone and the GEMMs alone (full batch) for the sum. Each half's output is
checked against the whole batch's rows.

    python3 overlap_probe.py OUT.json
"""
import dataclasses
import json
import sys

import torch
import torch.nn.functional as F

from loom.bench.ceilings import measure_ceilings
from loom.bench.common import git_commit, now_iso
from loom.bench.kernel_timing import KernelTimer
from loom.kernels.paged_decode import paged_decode

from llama_layers import D, H, HID, INTER, KH, layer_weights

dev = torch.device("cuda")
ceil = measure_ceilings(dev)
timer = KernelTimer(dev, warmup=3, iters=15)
timer.spin(1.0)
BS = 16
LAYERS = 4
dt = torch.bfloat16
torch.manual_seed(0)
weights = layer_weights(LAYERS, dev, dt)
rows = []


class Batch:
    """Paged-decode metadata of requests [lo, hi) of the step."""

    def __init__(self, table, lens, lo, hi):
        n = hi - lo
        self.n = n
        self.table = table[lo:hi].contiguous()
        self.lens = lens[lo:hi].contiguous()
        self.qsl = torch.arange(n + 1, device=dev, dtype=torch.int32)


def run_chain(x, b, cache, attn=True, gemm=True):
    for w in weights:
        if gemm:
            qkv = x @ w["qkv"].t()
            q = qkv[:, :H * D].view(b.n, H, D)
        else:
            q = x[:, :H * D].view(b.n, H, D)
        o = torch.empty(b.n, H, D, device=dev, dtype=dt)
        if attn:
            paged_decode(q, cache, o, b.table, b.qsl, b.lens, b.n, D ** -0.5, 1,
                         block_n=128, num_stages=3)
        else:
            o = q
        if gemm:
            x = o.view(b.n, -1) @ w["o"].t() + x
            gu = x @ w["gu"].t()
            x = (F.silu(gu[:, :INTER]) * gu[:, INTER:]) @ w["down"].t()
    return x


for B in (256, 484):
    ctx = torch.randint(1025, 1281, (B,), device=dev, dtype=torch.int32)
    per = (1280 + BS - 1) // BS
    table = torch.randperm(B * per, device=dev, dtype=torch.int32).view(B, per)
    cache = torch.randn(2, B * per, BS, KH, D, device=dev, dtype=dt)
    x0 = torch.randn(B, HID, device=dev, dtype=dt)
    whole = Batch(table, ctx, 0, B)
    half = [Batch(table, ctx, 0, B // 2), Batch(table, ctx, B // 2, B)]
    xs = [x0[:B // 2].clone(), x0[B // 2:].clone()]
    side = torch.cuda.Stream()

    def seq():
        return run_chain(x0, whole, cache)

    def halves():
        return torch.cat([run_chain(xs[i], half[i], cache) for i in range(2)])

    def two_streams():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        a = run_chain(xs[0], half[0], cache)
        with torch.cuda.stream(side):
            b = run_chain(xs[1], half[1], cache)
        main.wait_stream(side)
        return torch.cat([a, b])

    variants = {"seq": seq, "halves": halves, "2streams": two_streams,
                "attention only": lambda: run_chain(x0, whole, cache, gemm=False),
                "gemms only": lambda: run_chain(x0, whole, cache, attn=False)}
    ref = seq().float()
    for name, fn in variants.items():
        got = fn().float()
        err = ((got - ref).abs().max() / ref.abs().max()).item() if name in (
            "halves", "2streams") else 0.0
        us = timer.time_us(fn)
        kv_bytes = int(ctx.sum()) * KH * D * 2 * 2 * LAYERS
        print(f"B={B} {name:15s} {us:9.1f} us  ({us / LAYERS:7.1f} a layer)  err {err:.1e}"
              f"  KV {kv_bytes / us / 1e3:6.0f} GB/s", flush=True)
        rows.append({"batch": B, "variant": name, "us": us, "layers": LAYERS,
                     "us_per_layer": us / LAYERS, "max_rel_err": err,
                     "kv_bytes": kv_bytes})
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "git_commit": git_commit(), "date": now_iso(),
           "command": " ".join(["python3"] + sys.argv), "ceilings": dataclasses.asdict(ceil),
           "rows": rows}, open(sys.argv[1], "w"), indent=1)
