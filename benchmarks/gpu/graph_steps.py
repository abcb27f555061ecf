"""Where a decode step's time goes, from a `loom bench latency --profile` trace (-O 3).

Decode steps replay CUDA graphs: every kernel of one replay carries the correlation id of
its cudaGraphLaunch. Per replay this takes the span (its first kernel's start to its last
kernel's end) and the kernels' summed time, then the time from one replay's end to the next
one's start and the kernels run outside graphs there (sampling, input copies). Kernel
names are summed over the replays and printed as microseconds a step.

    python3 graph_steps.py PROFILE_DIR [--top N] [--json OUT]
"""
import argparse
import collections
import glob
import json
import statistics


def analyse(path: str, top: int) -> dict:
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    graph_launches = {e["args"]["correlation"] for e in events
                      if e.get("cat") == "cuda_runtime" and "GraphLaunch" in e.get("name", "")
                      and "correlation" in e.get("args", {})}
    gpu = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                 key=lambda e: e["ts"])
    replays = collections.defaultdict(list)
    for e in gpu:
        if e.get("args", {}).get("correlation") in graph_launches:
            replays[e["args"]["correlation"]].append(e)
    steps = sorted(replays.values(), key=lambda ks: ks[0]["ts"])
    if not steps:
        return {"trace": path, "replays": 0}
    per_name = collections.Counter()
    for ks in steps:
        for k in ks:
            per_name[k["name"][:90]] += k["dur"]
    spans = [ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"] for ks in steps]
    busy = [sum(k["dur"] for k in ks) for ks in steps]
    between, outside = [], collections.Counter()
    for a, b in zip(steps, steps[1:]):
        end, start = a[-1]["ts"] + a[-1]["dur"], b[0]["ts"]
        between.append(start - end)
        for k in gpu:
            if end <= k["ts"] < start:
                outside[k["name"][:90]] += k["dur"]
    n = len(steps)
    return {
        "trace": path, "replays": n,
        "span_us": statistics.median(spans), "busy_us": statistics.median(busy),
        "between_us": statistics.median(between) if between else None,
        "kernels_us_per_step": {k: v / n for k, v in per_name.most_common(top)},
        "outside_us_per_gap": {k: v / max(len(between), 1)
                               for k, v in outside.most_common(top)},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--json")
    args = p.parse_args()
    results = [analyse(t, args.top) for t in sorted(glob.glob(f"{args.dir}/**/*.json*",
                                                                 recursive=True))
               if t.endswith((".json", ".pt.trace.json"))]
    for r in results:
        print(f"{r['trace']}: {r['replays']} graph replays")
        if not r["replays"]:
            continue
        print(f"  median span {r['span_us']:.1f} us, kernels {r['busy_us']:.1f} us, "
              f"between replays {r['between_us'] or 0:.1f} us")
        for name, us in r["kernels_us_per_step"].items():
            print(f"  {us:9.1f} us/step  {name}")
        print("  outside graphs, between replays:")
        for name, us in r["outside_us_per_gap"].items():
            print(f"  {us:9.1f} us/gap   {name}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
