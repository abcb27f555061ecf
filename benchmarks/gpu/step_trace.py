"""Each profiled step of a `loom bench throughput --profile-steps` trace, side by side.

The worker names each profiled step's launch ("loom step N: P prompt tokens + D decodes", a
user annotation around `ModelRunner.launch`). A kernel belongs to the step whose annotation
holds the CUDA runtime call that launched it (same correlation id). Per step this prints the
launch's host time, the CUDA runtime calls that took the most of it (a cudaMalloc or a
synchronize shows here), the device time of the step's kernels and copies, and the span
from its first kernel's start to its last one's end; then the kernels that took the most
device time over the window, in ms per step. So a slow step reads as longer kernels (device
time up), a host stall (host time up, device time not), or waiting (span over device time).

    python3 step_trace.py PROFILE_DIR [--top N] [--json OUT]
"""
import argparse
import bisect
import glob
import json
import re
from collections import defaultdict
from pathlib import Path

from trace_gaps import load  # a sibling script: the trace's device ops, host ops, launches

STEP = re.compile(r"^loom step (\d+): ")


def steps_of(path: str) -> list[dict]:
    gpu, host, launches = load(path)
    marks = [e for e in host if STEP.match(e["name"])]  # host ops come sorted by start
    starts = [e["ts"] for e in marks]
    ops: list[list[dict]] = [[] for _ in marks]
    runtime: list[dict[str, float]] = [defaultdict(float) for _ in marks]
    owner_of = {}  # correlation id -> the step whose launch holds that runtime call
    for correlation, call in launches.items():
        i = bisect.bisect_right(starts, call["ts"]) - 1
        if i >= 0 and call["ts"] <= marks[i]["ts"] + marks[i]["dur"]:
            runtime[i][call["name"]] += call["dur"] / 1e3
            owner_of[correlation] = i
    for e in gpu:
        i = owner_of.get(e.get("args", {}).get("correlation"))
        if i is not None:
            ops[i].append(e)
    origin = starts[0] if starts else 0.0
    steps = []
    for mark, calls, mine in zip(marks, runtime, ops):
        kernels: dict[str, float] = defaultdict(float)
        for e in mine:
            kernels[e["name"]] += e["dur"] / 1e3
        first = min((e["ts"] for e in mine), default=None)
        steps.append({
            "label": mark["name"], "host_ms": mark["dur"] / 1e3,
            "host_start_ms": (mark["ts"] - origin) / 1e3, "runtime": calls,
            "kernels": kernels, "launches": len(mine), "device_ms": sum(kernels.values()),
            "span_ms": (max(e["ts"] + e["dur"] for e in mine) - first) / 1e3 if mine else 0.0,
            "device_start_ms": None if first is None else (first - origin) / 1e3})
    return steps


def report(steps: list[dict], top: int) -> None:
    for s in steps:
        calls = sorted(s["runtime"].items(), key=lambda kv: -kv[1])[:4]
        print(f"  {s['label']}")
        start = "-" if s["device_start_ms"] is None else f"{s['device_start_ms']:.1f}"
        print(f"    host: launch {s['host_ms']:.1f} ms from {s['host_start_ms']:.1f} ms; device: "
              f"{s['launches']} ops, {s['device_ms']:.1f} ms busy over a {s['span_ms']:.1f} ms "
              f"span from {start} ms")
        print("    runtime calls: " + ", ".join(f"{n} {ms:.1f} ms" for n, ms in calls))
    totals: dict[str, float] = defaultdict(float)
    for s in steps:
        for name, ms in s["kernels"].items():
            totals[name] += ms
    names = sorted(totals, key=lambda n: -totals[n])[:top]
    print("  device ms by kernel, one column a step:")
    print("    " + "".join(f"{STEP.match(s['label']).group(1):>9}" for s in steps))
    for name in names:
        print("    " + "".join(f"{s['kernels'].get(name, 0.0):9.2f}" for s in steps)
              + f"  {name[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile_dir")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json")
    args = parser.parse_args()
    traces = sorted(glob.glob(f"{args.profile_dir}/trace-rank*.json"))
    if not traces:
        parser.error(f"no trace-rank*.json in {args.profile_dir}")
    out = {Path(trace).name: steps_of(trace) for trace in traces}
    for name, steps in out.items():
        print(f"== {name}: {len(steps)} steps")
        report(steps, args.top)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
