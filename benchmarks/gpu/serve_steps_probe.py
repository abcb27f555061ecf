"""Serving's steps without the HTTP side: an 8B engine in this process, a 550-token prompt
added every 1/--rate s (150 output tokens each, greedy, ignore_eos), as `loom bench sweep
--rates 10` sends them; each step() call timed and each request's time from its arrival to
its first token. Only public engine calls (LLM.engine, LLM.processor), so that an older
tree runs it too (run_zzz3 runs it on 07a738d's).

run_zzv/zzw: at 10 QPS this tree's steps that carry a prompt took ~40-50 ms where
07a738d's took 15-35 (inter-token latency seen by the client); TTFT 52-88 ms against 40.5.
With --no-async a step() call is one step (launch and collect): a "prompt step" is one that
returns a request's first token. With async scheduling a call collects the step before, and
only the TTFT means anything.

    python3 serve_steps_probe.py [--no-async] [--cudagraph-mode M] [--json OUT]
"""
import argparse
import json
import logging
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, ".")
from loom import LLM, SamplingParams  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", default="llama-3.1-8b")
parser.add_argument("--rate", type=float, default=10.0)
parser.add_argument("--prompt-len", type=int, default=550)
parser.add_argument("--output-len", type=int, default=150)
parser.add_argument("--max-model-len", type=int, default=2048)
parser.add_argument("--seconds", type=float, default=12.0)
parser.add_argument("--no-async", action="store_true")
parser.add_argument("--cudagraph-mode", default=None)
parser.add_argument("--json", default=None)
parser.add_argument("--level", type=int, default=3)
parser.add_argument("--profile-prompt-steps", type=int, default=0, metavar="K",
                    help="with --no-async: run the steps that take in requests 40 .. 40+K-1 "
                         "under torch.profiler and print their kernels' GPU time per step")
parser.add_argument("--piece-sizes", default=None, metavar="N,N,...",
                    help="replace loom.worker.cuda_graph.PIECEWISE_SIZES (the token counts "
                         "other batches are padded to under FULL_AND_PIECEWISE)")
args = parser.parse_args()
if args.piece_sizes:
    import loom.worker.cuda_graph
    loom.worker.cuda_graph.PIECEWISE_SIZES = tuple(int(s) for s in args.piece_sizes.split(","))
# LOOM_LAYER_TIMES=1 logs each eager step's host and GPU time per layer (at INFO).
logging.basicConfig(level=logging.WARNING, format="%(asctime)s.%(msecs)03d %(message)s",
                    datefmt="%H:%M:%S")
for name in ("loom.worker.step_handle", "loom.worker.warmup", "loom.worker.model_runner",
             "loom.compilation.piece_graph", "loom.worker.cuda_graph"):
    logging.getLogger(name).setLevel(logging.INFO)  # and start-up's compile and warm-up times
# Decode graphs up to 64 (as run_zzz's servers): ~15-25 requests run at 10 QPS.
compilation = {"level": args.level, "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]}
if args.cudagraph_mode:
    compilation["cudagraph_mode"] = args.cudagraph_mode
llm = LLM(model=args.model, load_format="dummy", skip_tokenizer_init=True,
          max_model_len=args.max_model_len, max_num_batched_tokens=8192,
          async_scheduling=not args.no_async, compilation_config=compilation)
core = llm.engine
params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, temperature=0.0)
rng = np.random.default_rng(0)
steps = []  # (seconds, first tokens returned, requests stepped, wall clock at the end)
arrived, first = {}, {}
CUDA = torch.cuda.is_available()  # on the CPU (a check of this script) its ops are timed
ACTIVITY = torch.profiler.ProfilerActivity.CUDA if CUDA else torch.profiler.ProfilerActivity.CPU
DEVICE_TYPE = torch.autograd.DeviceType.CUDA if CUDA else torch.autograd.DeviceType.CPU
kernel_us: dict[str, list[float]] = {}  # name -> [GPU us, calls] summed over the profiled steps
profiled_wall_ms: list[float] = []
start = time.perf_counter()
next_at, i = start, 0
while True:
    now = time.perf_counter()
    while now >= next_at and now - start < args.seconds:
        rid = f"r{i}"
        core.add_request(llm.processor.process(
            rid, rng.integers(0, 100, args.prompt_len).tolist(), params))
        arrived[rid] = now
        i += 1
        next_at += 1 / args.rate
    if core.has_unfinished_requests():
        prof = None
        if args.no_async and 40 <= i - 1 < 40 + args.profile_prompt_steps \
                and f"r{i - 1}" not in first and len(profiled_wall_ms) < i - 40:
            prof = torch.profiler.profile(activities=[ACTIVITY])
            prof.__enter__()
        began = time.perf_counter()
        outputs = core.step().outputs
        ended = time.perf_counter()
        if prof is not None:
            if CUDA:
                torch.cuda.synchronize()
            prof.__exit__(None, None, None)
            profiled_wall_ms.append(1e3 * (ended - began))
            for ev in prof.key_averages():
                us = ev.self_device_time_total if CUDA else ev.self_cpu_time_total
                if ev.device_type == DEVICE_TYPE and us:
                    acc = kernel_us.setdefault(ev.key, [0.0, 0])
                    acc[0] += us
                    acc[1] += ev.count
        firsts = 0
        for out in outputs:
            if out.new_token_ids and out.request_id not in first:
                first[out.request_id] = ended
                firsts += 1
        steps.append((ended - began, firsts, len(outputs), time.time()))
    elif now - start >= args.seconds:
        break
    else:
        time.sleep(0.0002)
ttft = [1e3 * (first[r] - arrived[r]) for r in arrived if r in first]
prompt_steps = [s for s in steps if s[1]]
decode_steps = [s for s in steps if not s[1] and s[2]]


def pct(values, q):
    return float(np.percentile(values, q)) if values else float("nan")


result = {"args": vars(args), "requests": len(arrived), "ttft_ms": {
    "mean": statistics.fmean(ttft), "median": pct(ttft, 50), "p90": pct(ttft, 90)},
    "prompt_steps": {"n": len(prompt_steps),
                     "median_ms": 1e3 * pct([s[0] for s in prompt_steps], 50),
                     "p90_ms": 1e3 * pct([s[0] for s in prompt_steps], 90),
                     "mean_requests": statistics.fmean(s[2] for s in prompt_steps)},
    "decode_steps": {"n": len(decode_steps),
                     "median_ms": 1e3 * pct([s[0] for s in decode_steps], 50),
                     "p90_ms": 1e3 * pct([s[0] for s in decode_steps], 90)},
    "prompt_step_ms": [round(1e3 * s[0], 2) for s in prompt_steps],
    "prompt_step_requests": [s[2] for s in prompt_steps],
    "prompt_step_wall_clock": [round(s[3], 3) for s in prompt_steps]}
if torch.cuda.is_available():  # cudaMalloc / cudaFree in the run synchronise the device
    stats = torch.cuda.memory_stats()
    result["allocator"] = {k: stats.get(k) for k in ("num_alloc_retries", "num_device_alloc",
                                                     "num_device_free")}
print(json.dumps({k: v for k, v in result.items() if not k.startswith("prompt_step_")}),
      flush=True)
print("prompt steps (ms, requests):", list(zip(result["prompt_step_ms"],
                                               result["prompt_step_requests"]))[:40], flush=True)
if profiled_wall_ms:
    k = len(profiled_wall_ms)
    busy = sum(v[0] for v in kernel_us.values()) / k / 1e3
    print(f"profiled {k} prompt steps: wall {statistics.fmean(profiled_wall_ms):.2f} ms (under "
          f"the profiler), kernels {busy:.2f} ms of GPU time a step", flush=True)
    for name, (us, calls) in sorted(kernel_us.items(), key=lambda kv: -kv[1][0])[:25]:
        print(f"  {us / k / 1e3:8.3f} ms {calls / k:6.1f} calls  {name[:110]}", flush=True)
    result["profiled"] = {"wall_ms": profiled_wall_ms, "kernel_ms_per_step": busy,
                          "kernels": {n: [v[0] / k / 1e3, v[1] / k] for n, v in kernel_us.items()}}
if args.json:
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
