"""Does an SM partition let a step's GEMMs hide its decodes' KV reads? Issue 3's throughput.

run_zzz133 (mixed_overlap_probe.py) found two streams give nothing: each kernel fills the
GPU, and cuBLAS takes no SM count. Here the GEMMs run on `persistent_gemm.py`, a persistent
Triton GEMM of sms - s programs, on a high-priority stream, and the decodes' attention on
another, so that attention has s SMs to itself. What it bounds: every GEMM row of a step
(prompt + decode rows, merged as loom runs them) beside all of the step's decode attention,
as if a schedule (nano-batches, NanoFlow's) had cut the dependency between a layer's qkv and
its attention. If even that is not faster than today's merged chain, no schedule is.

Per layer, 8B shapes, LAYERS distinct layers, 484 decodes of 1152 tokens, rows timed:
  merged             today: cuBLAS GEMM chain over all rows, decode attention in line
  gemms cublas       the GEMM chain alone (no attention), cuBLAS
  attention          the decodes' attention alone (a fixed query each layer)
  gemms triton/pN    the GEMM chain alone on the persistent GEMM, N programs
  overlap cublas     cuBLAS GEMM chain beside the attention chain (two streams)
  overlap/sS         the GEMM chain on sms - S programs beside the attention chain; `flat`
                     drops the GEMM stream's priority
  nano/sS            a schedule that exists: the prompt rows' GEMM chain on sms - S programs
                     beside the decode rows' own chain (cuBLAS GEMMs, attention in line),
                     mixed_overlap_probe's two streams with the prompt held to its SMs
The Triton chain's output is checked against cuBLAS's. Each variant is one CUDA graph
(KernelTimer: L2 flushed, median).

    python3 partition_probe.py OUT.json
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
from persistent_gemm import Tiles, persistent_mm

dev = torch.device("cuda")
ceil = measure_ceilings(dev)
timer = KernelTimer(dev, warmup=3, iters=15)
timer.spin(1.0)
SMS = torch.cuda.get_device_properties(dev).multi_processor_count
LAYERS, DECODES, CONTEXT = 4, 484, 1152
dt = torch.bfloat16
torch.manual_seed(0)
weights = layer_weights(LAYERS, dev, dt)
inputs = make_inputs(decode_step(DECODES, CONTEXT), AttentionShape(H, KH, D), 16, dt, dev,
                     seed=1)
qd = torch.randn(DECODES, H, D, device=dev, dtype=dt)
backend = TritonBackend()
fast, slow = torch.cuda.Stream(priority=-1), torch.cuda.Stream()
rows, tiles = [], Tiles()


def attend(q):
    return backend.forward(q, inputs.kv_cache, inputs.meta, inputs.scale)


def gemm_chain(x, programs=0, decodes=0):
    """The layers' GEMMs over x (cuBLAS where programs is 0); the last `decodes` rows also
    attend in line, as loom's merged step does."""
    mm = None if not programs else (lambda a, w: persistent_mm(a, w, programs, tiles))
    return layer_chain(x, weights, mm, attend, decodes)


def attention_chain():
    for _ in weights:
        attend(qd)


def two_streams(first, second, first_stream=fast):
    """first() on first_stream beside second() on a low-priority one; both outputs."""
    main = torch.cuda.current_stream()
    first_stream.wait_stream(main)
    slow.wait_stream(main)
    with torch.cuda.stream(first_stream):
        a = first()
    with torch.cuda.stream(slow):
        b = second()
    main.wait_stream(first_stream)
    main.wait_stream(slow)
    return a, b


def overlap(x, programs, gemm_stream=fast):
    return two_streams(lambda: gemm_chain(x, programs), attention_chain, gemm_stream)[0]


def nano(x, prompt, programs):
    xp, xd = x[:prompt], x[prompt:]
    return torch.cat(two_streams(lambda: gemm_chain(xp, programs),
                                 lambda: gemm_chain(xd, 0, DECODES)))


def record(prompt, name, fn, ref=None, **extra):
    got = fn()
    err = 0.0 if ref is None else ((got.float() - ref).abs().max() / ref.abs().max()).item()
    us = timer.time_us(fn)
    print(f"prompt {prompt:5d} {name:20s} {us / LAYERS:8.1f} us a layer  err {err:.1e}",
          flush=True)
    rows.append({"prompt_tokens": prompt, "decodes": DECODES, "context": CONTEXT,
                 "variant": name, "us": us, "layers": LAYERS, "us_per_layer": us / LAYERS,
                 "max_rel_err": err, **extra})
    return us


# the persistent GEMM's tiles: the fastest of a few on gate_up's shape, all SMs, against cuBLAS
x = torch.randn(2048 + DECODES, HID, device=dev, dtype=dt)
w = weights[0]["gu"]
flops = 2 * x.shape[0] * w.shape[0] * HID
cublas_us = timer.time_us(lambda: x @ w.t())
print(f"gate_up {x.shape[0]} rows, cuBLAS: {cublas_us:.1f} us "
      f"({flops / cublas_us / 1e6:.0f} TFLOP/s)", flush=True)
best = None
for cand in (Tiles(), Tiles(block_n=128, num_stages=4), Tiles(block_m=256, block_n=128),
             Tiles(num_stages=4), Tiles(block_n=128, block_k=128, num_stages=3)):
    try:
        us = timer.time_us(lambda: persistent_mm(x, w, SMS, cand))
    except Exception as e:  # out of shared memory and the like: say so, try the next
        print(f"  {cand}: {type(e).__name__}: {str(e)[:120]}", flush=True)
        continue
    print(f"  {cand}: {us:.1f} us ({flops / us / 1e6:.0f} TFLOP/s, "
          f"{cublas_us / us:.2f}x cuBLAS)", flush=True)
    rows.append({"variant": "tiles", "tiles": dataclasses.asdict(cand), "us": us,
                 "cublas_us": cublas_us, "rows": x.shape[0]})
    if best is None or us < best[0]:
        best = (us, cand)
tiles = best[1]
print(f"tiles: {tiles}", flush=True)
# and at prefill 8192's shapes (issue 3's other open target), all SMs, against cuBLAS
for name, w in weights[0].items():
    a = torch.randn(8192, w.shape[1], device=dev, dtype=dt)
    cublas_us = timer.time_us(lambda: a @ w.t())
    us = timer.time_us(lambda: persistent_mm(a, w, SMS, tiles))
    flops = 2 * 8192 * w.numel()
    print(f"prefill 8192 {name:4s}: cuBLAS {cublas_us:8.1f} us ({flops / cublas_us / 1e6:.0f} "
          f"TFLOP/s), persistent {us:8.1f} ({cublas_us / us:.2f}x cuBLAS)", flush=True)
    rows.append({"variant": f"prefill 8192 {name}", "us": us, "cublas_us": cublas_us,
                 "flops": flops})

for prompt in (2048, 4096):
    x = torch.randn(prompt + DECODES, HID, device=dev, dtype=dt)
    ref = gemm_chain(x).float()
    merged_ref = gemm_chain(x, decodes=DECODES).float()
    merged = record(prompt, "merged", lambda: gemm_chain(x, decodes=DECODES))
    record(prompt, "gemms cublas", lambda: gemm_chain(x))
    record(prompt, "attention", attention_chain)
    for s in (0, 16, 32, 48):
        record(prompt, f"gemms triton/p{SMS - s}", lambda: gemm_chain(x, SMS - s), ref,
               programs=SMS - s)
    us = record(prompt, "overlap cublas", lambda: overlap(x, 0), ref)
    rows[-1]["ratio_to_merged"] = us / merged
    for s, stream in ((16, fast), (32, fast), (48, fast), (32, torch.cuda.Stream())):
        name = f"overlap/s{s}" + ("" if stream is fast else " flat")
        us = record(prompt, name, lambda: overlap(x, SMS - s, stream), ref, programs=SMS - s)
        rows[-1]["ratio_to_merged"] = us / merged
        print(f"  {us / merged:.3f}x merged", flush=True)
    for s in (16, 32, 48):
        us = record(prompt, f"nano/s{s}", lambda: nano(x, prompt, SMS - s), merged_ref,
                    programs=SMS - s)
        rows[-1]["ratio_to_merged"] = us / merged
        print(f"  {us / merged:.3f}x merged", flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "git_commit": git_commit(), "date": now_iso(),
           "command": " ".join(["python3"] + sys.argv), "ceilings": dataclasses.asdict(ceil),
           "sms": SMS, "tiles": dataclasses.asdict(tiles), "rows": rows},
          open(sys.argv[1], "w"), indent=1)
