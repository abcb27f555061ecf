"""Can a prompt's GEMMs hide the decodes' KV reads? Issue 3's throughput lever, bounded.

Throughput's 1000 x 1024 -> 256 spends ~9 s reading decodes' KV caches at the copy rate and
~19 s on prompt math at the matmul rate; loom runs them one after the other (41 s against
the issue's 1.5x = 34.6 s). Session 26 found two half-batches of *decodes* on two streams
no faster (each half's kernels fill the GPU). This asks the other question: a step's prompt
tokens and its decode tokens as two sub-batches, each its own layer chain, on two streams,
so that one's KV reads run beside the other's tensor-core math. With cuBLAS told to leave
some SMs free (`torch._C._set_sm_carveout_experimental`) or not.

Per layer, 8B shapes, LAYERS distinct layers, decode KV over one shared paged cache:
  merged       today: one GEMM chain over prompt + decode rows, then decode attention
  2streams/cN  prompt rows' GEMM chain on one stream, decode rows' chain (GEMMs, then the
               backend's decode attention) on another, cuBLAS carve-out N SMs
plus the prompt GEMMs alone, the decode chain alone and attention alone. Prompt attention
is left out (causal 1024-token prompts: a few % of the prompt's math). Each variant is one
CUDA graph (KernelTimer: L2 flushed, median). The two-stream rows' outputs are checked
against the merged chain's.

    python3 mixed_overlap_probe.py OUT.json
"""
import dataclasses
import json
import sys

import torch

from loom.attention.triton_backend import TritonBackend
from loom.bench.attention_workload import AttentionShape, decode_step, make_inputs
from loom.bench.ceilings import measure_ceilings
from loom.bench.common import git_commit, now_iso
from loom.bench.kernel_timing import KernelTimer

from llama_layers import D, H, HID, KH, layer_chain, layer_weights

dev = torch.device("cuda")
ceil = measure_ceilings(dev)
timer = KernelTimer(dev, warmup=3, iters=15)
timer.spin(1.0)
LAYERS, DECODES, CONTEXT = 4, 484, 1152
dt = torch.bfloat16
torch.manual_seed(0)
weights = layer_weights(LAYERS, dev, dt)
step = decode_step(DECODES, CONTEXT)
inputs = make_inputs(step, AttentionShape(H, KH, D), 16, dt, dev, seed=1)
backend = TritonBackend()
side = torch.cuda.Stream()
rows = []


def attention(q):
    return backend.forward(q, inputs.kv_cache, inputs.meta, inputs.scale)


def chain(x, decodes=0, gemm=True):
    """The layers over x (`layer_chain`); its last `decodes` rows also attend over the paged
    cache in line. gemm=False: the attention alone, each layer's query a copied slice of x
    in place of the qkv GEMM's q columns."""
    if gemm:
        return layer_chain(x, weights, attend=attention, decodes=decodes)
    for _ in weights:
        q = x.repeat(1, 2)[:, :H * D]
        o = attention(q[-decodes:].reshape(decodes, H, D)).reshape(decodes, H * D)
        x = (torch.cat([q[:-decodes], o]) if decodes < len(x) else o).contiguous()
    return x


def two_streams(xp, xd):
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        d = chain(xd, DECODES)
    p = chain(xp)
    main.wait_stream(side)
    return torch.cat([p, d])


def record(prompt, name, fn, ref=None, carveout=0):
    torch._C._set_sm_carveout_experimental(carveout or None)
    try:
        got = fn().float()
        err = ((got - ref).abs().max() / ref.abs().max()).item() if ref is not None else 0.0
        us = timer.time_us(fn)
    finally:
        torch._C._set_sm_carveout_experimental(None)
    flops = 2 * (prompt + DECODES) * LAYERS * sum(w.numel() for w in weights[0].values())
    kv = DECODES * CONTEXT * KH * D * 2 * 2 * LAYERS
    print(f"prompt {prompt:5d} {name:18s} {us / LAYERS:8.1f} us a layer  err {err:.1e}",
          flush=True)
    rows.append({"prompt_tokens": prompt, "decodes": DECODES, "context": CONTEXT,
                 "variant": name, "carveout_sms": carveout, "us": us, "layers": LAYERS,
                 "us_per_layer": us / LAYERS, "max_rel_err": err, "gemm_flops": flops,
                 "kv_bytes": kv})
    return us


for prompt in (2048, 4096):
    x = torch.randn(prompt + DECODES, HID, device=dev, dtype=dt)
    xp, xd = x[:prompt].clone(), x[prompt:].clone()
    ref = chain(x, DECODES).float()
    merged = record(prompt, "merged", lambda: chain(x, DECODES))
    record(prompt, "prompt gemms", lambda: chain(xp))
    record(prompt, "prompt gemms/c32", lambda: chain(xp), carveout=32)
    record(prompt, "decode chain", lambda: chain(xd, DECODES))
    record(prompt, "decode attention", lambda: chain(xd, DECODES, gemm=False))
    for carve in (0, 8, 16, 32, 48):
        us = record(prompt, f"2streams/c{carve}", lambda: two_streams(xp, xd), ref, carve)
        rows[-1]["ratio_to_merged"] = us / merged
        print(f"  {us / merged:.3f}x merged", flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "git_commit": git_commit(), "date": now_iso(),
           "command": " ".join(["python3"] + sys.argv), "ceilings": dataclasses.asdict(ceil),
           "rows": rows}, open(sys.argv[1], "w"), indent=1)
