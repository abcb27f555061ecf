"""Where the GPU sits idle in a profiled iteration, from `loom bench latency --profile` traces.

The profiler window holds one whole `generate` call. This prints, per rank: the window, how
long the GPU waited before its first kernel and after its last one, the idle time between
kernels, and the largest gaps, each with the kernel after it, how long after the gap's start
the host launched that kernel (near 0: the GPU waited for the host) and the host op that
launched it. Host ops before the first launch and after the last kernel are listed too.

    python3 trace_gaps.py PROFILE_DIR [--top N] [--json OUT]

Where the trace holds Python frames (`LOOM_TORCH_PROFILER_WITH_STACK=1`), the GPU's idle
time is also summed by what the host was running then: sampled at most 10 us apart in each
gap (each sample weighing its share of the gap), the innermost three of loom's own frames.
"""
import argparse
import bisect
import glob
import heapq
import json
from collections import defaultdict

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
"""Host calls that launch device work: Triton kernels launch through the driver API
(cuLaunchKernelEx); run_zzz142's prompt steps counted 136 of their ops without it."""


def load(path: str) -> tuple[list, list, dict]:
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    gpu = sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    host = sorted((e for e in events if e.get("cat") in ("cpu_op", "user_annotation",
                                                          "python_function")),
                  key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})}
    return gpu, host, launches


def enclosing(host: list, starts: list, ts: float) -> str:
    """The innermost host op running at `ts` (the shortest one that contains it)."""
    best = None
    for e in host[max(0, bisect.bisect_right(starts, ts) - 400):bisect.bisect_right(starts, ts)]:
        if e["ts"] <= ts <= e["ts"] + e["dur"] and (best is None or e["dur"] < best["dur"]):
            best = e
    return best["name"][:70] if best else "-"


def top_level(host: list, lo: float, hi: float, n: int) -> list:
    """The longest host ops that start in [lo, hi), with their offset from lo."""
    inside = [e for e in host if lo <= e["ts"] < hi]
    inside.sort(key=lambda e: -e["dur"])
    return [(e["name"][:70], round(e["ts"] - lo, 1), round(e["dur"], 1)) for e in inside[:n]]


def idle_by_frames(path: str, gaps: list, step_us: float = 10.0) -> list:
    """(ms, loom frames) of the GPU's idle time, by the host's innermost loom frames."""
    with open(path) as f:
        frames = sorted(((e["ts"], e["ts"] + e["dur"], e["name"]) for e in json.load(f)[
            "traceEvents"] if e.get("ph") == "X" and e.get("cat") == "python_function"
            and "loom/" in e.get("name", "")), key=lambda e: e[0])
    if not frames:
        return []
    points = []  # (time, weight): samples at most step_us apart, each gap's own length
    for dur, at, _, _ in gaps:
        n = max(1, int(dur // step_us))
        points += [(at + dur * (i + 0.5) / n, dur / n) for i in range(n)]
    total: dict[str, float] = defaultdict(float)
    active: list = []  # heap of (end, start, name)
    i = 0
    for t, weight in sorted(points):
        while i < len(frames) and frames[i][0] <= t:
            heapq.heappush(active, (frames[i][1], frames[i][0], frames[i][2]))
            i += 1
        while active and active[0][0] < t:
            heapq.heappop(active)
        chain = [name.split("loom/", 1)[1] for _, _, name in sorted(active, key=lambda a: a[1])]
        total[" > ".join(chain[-3:]) or "(no loom frame)"] += weight / 1e3
    return sorted(((round(ms, 2), name) for name, ms in total.items()), reverse=True)


def analyse(path: str, top: int) -> dict:
    gpu, host, launches = load(path)
    starts = [e["ts"] for e in host]
    window = (min(e["ts"] for e in host), max(e["ts"] + e["dur"] for e in host))
    busy, gaps, end = 0.0, [], gpu[0]["ts"]
    for prev, k in zip([None] + gpu, gpu):
        if k["ts"] > end and prev is not None:
            gaps.append((k["ts"] - end, end, prev, k))
        busy += max(0.0, k["ts"] + k["dur"] - max(end, k["ts"]))
        end = max(end, k["ts"] + k["dur"])
    first, last = gpu[0]["ts"], end
    rows = []
    for dur, at, prev, k in sorted(gaps, key=lambda g: -g[0])[:top]:
        launch = launches.get(k.get("args", {}).get("correlation"))
        rows.append({
            "at_us": round(at - window[0], 1), "gap_us": round(dur, 1),
            "before": prev["name"][:50], "after": k["name"][:50],
            "launched_us_after_gap_start": round(launch["ts"] - at, 1) if launch else None,
            "by": enclosing(host, starts, launch["ts"]) if launch else "-"})
    return {
        "window_us": round(window[1] - window[0], 1),
        "before_first_kernel_us": round(first - window[0], 1),
        "after_last_kernel_us": round(window[1] - last, 1),
        "gpu_span_us": round(last - first, 1), "gpu_busy_us": round(busy, 1),
        "idle_between_kernels_us": round(last - first - busy, 1), "gaps": len(gaps),
        "largest_gaps": rows,
        "host_before_first_kernel": top_level(host, window[0], first, top),
        "host_after_last_kernel": top_level(host, last, window[1], top),
        "idle_by_frames": idle_by_frames(path, gaps)[:25]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile_dir")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json")
    args = parser.parse_args()
    out = {}
    for path in sorted(glob.glob(f"{args.profile_dir}/trace-rank*.json")):
        r = out[path.rsplit("/", 1)[-1]] = analyse(path, args.top)
        print(f"== {path}")
        for key in ("window_us", "before_first_kernel_us", "after_last_kernel_us",
                    "gpu_span_us", "gpu_busy_us", "idle_between_kernels_us", "gaps"):
            print(f"  {key}: {r[key]}")
        print("  largest gaps (at, gap, launched after gap start, by, kernel after):")
        for g in r["largest_gaps"]:
            print(f"    {g['at_us']:>10} {g['gap_us']:>8} {g['launched_us_after_gap_start']!s:>8}"
                  f"  {g['by'][:40]:40} {g['after']}")
        if r["idle_by_frames"]:
            print("  GPU idle by the host's innermost loom frames (ms, frames):")
            for ms, name in r["idle_by_frames"]:
                print(f"    {ms:8.2f}  {name[-150:]}")
        for key in ("host_before_first_kernel", "host_after_last_kernel"):
            print(f"  {key} (name, offset, dur):")
            for row in r[key]:
                print(f"    {row}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
