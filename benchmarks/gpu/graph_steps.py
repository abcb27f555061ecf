"""Where a decode step's time goes, from a `loom bench latency --profile` trace (-O 3).

Decode steps replay CUDA graphs of the whole forward, prompt steps piecewise graphs
between their attention calls: every kernel of one replay carries the correlation id of its
cudaGraphLaunch, and replays are grouped by their count of kernels (one group per kind of
graph). Per group: the median span of a replay (its first kernel's start to its last
kernel's end) and its kernels' summed time; each kernel name's calls and microseconds a
replay; and, between two of the group's replays in a row, the gap and the kernels run in
it (sampling, input copies; between two pieces, the attention).

    python3 graph_steps.py PROFILE_DIR [--top N] [--json OUT]
"""
import argparse
import bisect
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
    # A decode step's whole-forward graph against a prompt step's piecewise graphs: told
    # apart by their kernel counts.
    kinds = collections.defaultdict(list)
    for ks in sorted(replays.values(), key=lambda ks: ks[0]["ts"]):
        kinds[len(ks)].append(ks)
    return {"trace": path, "graphs": [_kind(steps, gpu, graph_launches, top) for _, steps in
                                      sorted(kinds.items(), key=lambda kv: -kv[0])]}


def _kind(steps: list[list[dict]], gpu: list[dict], graph_launches: set, top: int) -> dict:
    """Replays of one kernel count: per replay, the span, the kernels' time, each kernel
    name's calls and time; between two replays in a row (no other graph's replay between
    them), the gap and the kernels in it."""
    per_name, calls = collections.Counter(), collections.Counter()
    for ks in steps:
        for k in ks:
            per_name[k["name"][:90]] += k["dur"]
            calls[k["name"][:90]] += 1
    spans = [ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"] for ks in steps]
    busy = [sum(k["dur"] for k in ks) for ks in steps]
    between, outside = [], collections.Counter()
    starts = [k["ts"] for k in gpu]
    for a, b in zip(steps, steps[1:]):
        end, start = a[-1]["ts"] + a[-1]["dur"], b[0]["ts"]
        gap = gpu[bisect.bisect_left(starts, end):bisect.bisect_left(starts, start)]
        if any(k.get("args", {}).get("correlation") in graph_launches for k in gap):
            continue
        between.append(start - end)
        for k in gap:
            outside[k["name"][:90]] += k["dur"]
    n = len(steps)
    return {
        "kernels_per_replay": len(steps[0]), "replays": n,
        "span_us": statistics.median(spans), "busy_us": statistics.median(busy),
        "between_us": statistics.median(between) if between else None,
        "kernels_per_replay_us": {k: [calls[k] / n, v / n] for k, v in per_name.most_common(top)},
        "between_us_per_gap": {k: v / max(len(between), 1) for k, v in outside.most_common(top)},
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    for r in results:
        print(r["trace"])
        for g in r["graphs"]:
            print(f"  {g['replays']} replays of {g['kernels_per_replay']} kernels: median span "
                  f"{g['span_us']:.1f} us, kernels {g['busy_us']:.1f} us, between two "
                  f"{g['between_us'] or 0:.1f} us")
            for name, (n, us) in g["kernels_per_replay_us"].items():
                print(f"  {us:9.1f} us in {n:5.1f} calls a replay  {name}")
            print("  between two replays in a row:")
            for name, us in g["between_us_per_gap"].items():
                print(f"  {us:9.1f} us  {name}")


if __name__ == "__main__":
    main()
