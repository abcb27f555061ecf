"""Where a decode step's time goes, from the Chrome traces `loom bench latency --profile` writes.

Each decode forward is one CUDA-graph replay; its kernels carry the correlation id of the
host's cudaGraphLaunch. A step runs from one replay's first kernel to the next one's, so it
holds the replay, the sampling and input copies around it, and the GPU's idle time (the
wait for the host). Prints, per rank, the median microseconds per step by kernel kind and
writes them as JSON:

    python3 decode_steps.py PROFILE_DIR [--json OUT]
"""
import argparse
import glob
import json
import re
import statistics
import sys
from collections import defaultdict

KINDS = [  # first match wins
    ("all_reduce", r"all_reduce|one_shot|two_shot|nccl|AllReduce"),
    ("moe", r"_gate_up|_down_kernel|_down_gemv|_align_"),
    ("gemv", r"_gemv_kernel|_split_k_reduce_kernel"),
    ("cublas", r"nvjet|gemm|cutlass|splitKreduce|xmma"),
    ("attention", r"_decode_split|_decode_reduce|_prefill|kv_write|rope"),
    ("sampling", r"argmax|sampl|gumbel"),
    ("inductor", r"^triton_"),
    ("silu_mul", r"silu"),
    ("copy", r"Memcpy|Memset|copy_kernel|elementwise"),
]


def kind(name: str) -> str:
    for label, pattern in KINDS:
        if re.search(pattern, name):
            return label
    return "other"


def steps_of(trace: dict, sequence: list | None = None) -> list[dict]:
    events = trace["traceEvents"]
    launches = {e["args"].get("correlation") for e in events
                if e.get("ph") == "X" and e.get("name") == "cudaGraphLaunch" and "args" in e}
    kernels = sorted((e for e in events if e.get("ph") == "X"
                      and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                     key=lambda e: e["ts"])
    starts, seen = [], set()
    for i, k in enumerate(kernels):
        c = k.get("args", {}).get("correlation")
        if c in launches and c not in seen:
            seen.add(c)
            starts.append(i)
    steps = []
    for a, b in zip(starts, starts[1:]):
        ks = kernels[a:b]
        if sequence is not None:
            sequence.append([(k["name"][:60], round(k["ts"] - ks[0]["ts"], 2), k["dur"])
                             for k in ks])
        span = kernels[b]["ts"] - ks[0]["ts"]
        per = defaultdict(float)
        for k in ks:
            per[kind(k["name"])] += k["dur"]
        busy = sum(per.values())
        per.update(span=span, busy=busy, idle=span - busy, kernels=len(ks))
        steps.append(per)
    return steps


def summarize(steps: list[dict]) -> dict:
    keys = sorted({k for s in steps for k in s})
    return {k: round(statistics.median(s.get(k, 0.0) for s in steps), 1) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile_dir")
    parser.add_argument("--json")
    parser.add_argument("--sequence", type=int, metavar="N",
                        help="also print the Nth step's kernels in order: start, duration, gap")
    args = parser.parse_args()
    out = {}
    for path in sorted(glob.glob(f"{args.profile_dir}/trace-rank*.json")):
        seq: list = []
        steps = steps_of(json.load(open(path)), seq)
        # the first replays follow the prefill; the last one has no successor
        steps = steps[2:] if len(steps) > 10 else steps
        if not steps:
            print(f"{path}: no CUDA-graph replays found", file=sys.stderr)
            continue
        med = summarize(steps)
        out[path.rsplit("/", 1)[-1]] = {"steps": len(steps), "median_us": med}
        order = sorted((k for k in med if k not in ("span", "busy", "idle", "kernels")),
                       key=lambda k: -med[k])
        print(f"{path}: {len(steps)} steps, median span {med['span']} us, busy {med['busy']}, "
              f"idle {med['idle']}, {med['kernels']:.0f} kernels")
        print("  " + ", ".join(f"{k} {med[k]}" for k in order))
        if args.sequence is not None and len(seq) > args.sequence + 2:
            end = 0.0
            for name, start, dur in seq[args.sequence + 2]:
                print(f"    {start:9.2f} {dur:7.2f} gap {start - end:6.2f}  {name}")
                end = start + dur
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
