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

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
STEP = re.compile(r"^loom step (\d+): ")


def steps_of(path: str) -> list[dict]:
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    marks = sorted((e for e in events if STEP.match(e.get("name", ""))), key=lambda e: e["ts"])
    starts = [e["ts"] for e in marks]
    steps = [{"label": e["name"], "host_ms": e["dur"] / 1e3, "runtime": defaultdict(float),
              "kernels": defaultdict(float), "first": None, "last": None, "launches": 0}
             for e in marks]

    def owner(ts: float) -> dict | None:
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts <= marks[i]["ts"] + marks[i]["dur"]:
            return steps[i]
        return None

    by_correlation = {}
    for e in events:
        if e.get("cat") == "cuda_runtime" and (step := owner(e["ts"])) is not None:
            step["runtime"][e["name"]] += e["dur"] / 1e3
            if "correlation" in e.get("args", {}):
                by_correlation[e["args"]["correlation"]] = step
    for e in events:
        if e.get("cat") not in GPU_CATS:
            continue
        step = by_correlation.get(e.get("args", {}).get("correlation"))
        if step is None:
            continue
        step["kernels"][e["name"]] += e["dur"] / 1e3
        step["launches"] += 1
        end = e["ts"] + e["dur"]
        step["first"] = e["ts"] if step["first"] is None else min(step["first"], e["ts"])
        step["last"] = end if step["last"] is None else max(step["last"], end)
    origin = starts[0] if starts else 0.0
    for step, mark in zip(steps, marks):
        step["host_start_ms"] = (mark["ts"] - origin) / 1e3
        step["device_ms"] = sum(step["kernels"].values())
        step["span_ms"] = (step["last"] - step["first"]) / 1e3 if step["first"] else 0.0
        step["device_start_ms"] = (step["first"] - origin) / 1e3 if step["first"] else None
        del step["first"], step["last"]
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
