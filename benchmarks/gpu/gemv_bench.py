#!/usr/bin/env python3
"""Does loom's Triton GEMV (loom/kernels/gemv.py) beat cuBLAS at batch 1-4 decode shapes?

Llama-3.1-8B at tensor-parallel 2, one rank's weights (y = x @ W^T, W [N, K] bf16):

    qkv      3072 x 4096   25 MB      o_proj   4096 x 2048   17 MB
    gate_up 14336 x 4096  117 MB      down     4096 x 7168   59 MB
    lm_head 64128 x 4096  525 MB      down+silu: x = [gate | up], silu(gate) * up fused

For each shape and M in {1, 2, 4} it times F.linear (cuBLAS) and Triton candidates, each
as 20 back-to-back calls captured in one CUDA graph (no launch overhead, as in decode),
median of 10 replays / 20, with the calls rotating through enough weight copies (> 256 MiB)
that no weight is L2-resident. Every candidate is checked against F.linear on fresh inputs
first; a failing one is reported and skipped. The floor of a shape is its weight's bytes
over the copy rate (dst.copy_(src), read + write bytes, best of 5, as loom.bench.ceilings).

The search is staged, to stay within about 90 s including Triton's compiles:
  1. M = 1: every row-reduction tile (block_n 8-64, block_k 128-1024, 4 or 8 warps, within
     8-64 weight elements per thread) with num_stages 1 (register loads) and 3 (an
     asynchronous-copy pipeline), plus the tensor-core (`use_dot`) tiles at 3 and 4 stages;
  2. M = 2, 4: each shape's best M = 1 tiles, and the dot tiles;
  3. every (shape, M): the other num_stages around the best config, and split-K
     (2, 4; "fixup", "reduce", "atomic") around the best two.
Compiles run ahead of each stage in a pool of worker processes (--jobs) that fill Triton's
on-disk cache; the timing process then only loads the kernels. --budget-s (80) is a soft
limit on the run after imports: stage 3 is trimmed past 55 % of it and skipped past 85 %,
and no candidate is timed past 110 % (each skip is noted in the JSON).

Prints one line per (shape, M): the floor, cuBLAS and the best Triton config in us and as
eff = floor / time; then the best of each kernel family. The JSON holds every candidate.

    python3 benchmarks/gpu/gemv_bench.py --output-json /tmp/gemv.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("TRITON_INTERPRET", "0")

SHAPES = {  # name: (N, K, silu_mul_input)
    "qkv": (3072, 4096, False),
    "o_proj": (4096, 2048, False),
    "gate_up": (14336, 4096, False),
    "down": (4096, 7168, False),
    "lm_head": (64128, 4096, False),
    "down+silu": (4096, 7168, True),
    # one GPU (TP=1): for the table's 1-GPU rows (--shapes qkv1,o1,gate_up1,down1,lm_head1)
    "qkv1": (6144, 4096, False),
    "o1": (4096, 4096, False),
    "gate_up1": (28672, 4096, False),
    "down1": (4096, 14336, False),
    "lm_head1": (128256, 4096, False),
    # Qwen3-30B-A3B on one GPU (--shapes q3_qkv,q3_o,q3_router,q3_lm_head): its attention
    # and router run on cuBLAS at batch-1 decode until the table has them
    "q3_qkv": (5120, 2048, False),
    "q3_o": (2048, 4096, False),
    "q3_router": (128, 2048, False),
    "q3_lm_head": (151936, 2048, False),
    # the same at TP=2, one rank's shards (--shapes q3tp2_qkv,q3tp2_o,q3tp2_lm_head); the
    # router is replicated, so q3_router serves both
    "q3tp2_qkv": (2560, 2048, False),
    "q3tp2_o": (2048, 2048, False),
    "q3tp2_lm_head": (75968, 2048, False),
}
DEFAULT_SHAPES = ("qkv", "o_proj", "gate_up", "down", "lm_head", "down+silu")
PROFILED_CUBLAS_US = {"qkv": 9.42 + 1.7, "o_proj": 6.73, "gate_up": 30.96,
                      "down": 17.47 + 1.7, "lm_head": 129.6}
"""The decode profile's cuBLAS kernel times at M = 1 (split-K reduce included), for context."""

CALLS_PER_GRAPH = 20
REPLAYS = 10
POOL_BYTES = 256 << 20
DOT_TILES = [(16, 128), (16, 256), (32, 128), (32, 256), (64, 128)]


def log(msg: str) -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------
# Candidates

def fma_tiles(m: int) -> list[tuple[int, int, int]]:
    """(block_n, block_k, num_warps) of the row-reduction path within a register budget:
    8 to 64 weight elements per thread (32 at M = 4, whose products keep more live)."""
    emax = 64 if m <= 2 else 32
    out = []
    for warps in (4, 8):
        for bn in (8, 16, 32, 64):
            for bk in (128, 256, 512, 1024):
                if 8 <= bn * bk // (32 * warps) <= emax:
                    out.append((bn, bk, warps))
    return out


def fits(cfg, k: int) -> bool:
    """Even slices of whole chunks (no masked tail), and shared memory for the pipeline."""
    if k % (cfg.split_k * cfg.block_k):
        return False
    rows = cfg.block_n + (16 if cfg.use_dot else 0)
    return max(cfg.num_stages - 1, 1) * rows * cfg.block_k * 2 <= 160 * 1024


def stage1(gemv_config, k: int) -> list:
    cands = [gemv_config(block_n=bn, block_k=bk, num_warps=w, num_stages=s)
             for bn, bk, w in fma_tiles(1) for s in (1, 3)]
    cands += [gemv_config(block_n=bn, block_k=bk, num_warps=4, num_stages=s, use_dot=True)
              for bn, bk in DOT_TILES for s in (3, 4)]
    return [c for c in cands if fits(c, k)]


def ranked(entry: dict) -> list[tuple[float, dict]]:
    return sorted(((c["us"], c["config"]) for c in entry["candidates"].values()
                   if c.get("us") is not None), key=lambda t: t[0])


def stage2(gemv_config, k: int, m: int, m1_entry: dict) -> list:
    best = ranked(m1_entry)
    fma = [c for _, c in best if not c["use_dot"]][:4]
    emax_ok = {(bn, bk, w) for bn, bk, w in fma_tiles(m)}
    cands = [gemv_config(**c) for c in fma if (c["block_n"], c["block_k"], c["num_warps"])
             in emax_ok]
    if len(cands) < 2:  # the M = 1 winners are too large for M's registers: next best
        cands += [gemv_config(**c) for _, c in best if not c["use_dot"]
                  and (c["block_n"], c["block_k"], c["num_warps"]) in emax_ok][:3]
    cands += [gemv_config(block_n=bn, block_k=bk, num_warps=4, num_stages=s, use_dot=True)
              for bn, bk in DOT_TILES for s in (3, 4)]
    return [c for c in dict.fromkeys(cands) if fits(c, k)]


def stage3(gemv_config, k: int, entry: dict, trim: bool) -> list:
    best = [c for _, c in ranked(entry) if c["split_k"] == 1][:2]
    if not best:
        return []
    rep = dataclasses.replace
    top = gemv_config(**best[0])
    cands = []
    if not trim:
        stages = (2, 3, 4) if top.use_dot else (1, 2, 3, 4)
        cands += [rep(top, num_stages=s) for s in stages if s != top.num_stages]
    def split(cfg, s, mode):
        """cfg cut into s slices of K, its chunk halved (not below 64) until they divide K
        (K = 7168 = 7 * 1024 takes 2 x 512 or 4 x 256, not 1024-wide chunks)."""
        bk = cfg.block_k
        while k % (s * bk) and bk > 64:
            bk //= 2
        return rep(cfg, block_k=bk, split_k=s, split_mode=mode)

    modes = ("fixup",) if trim else ("fixup", "reduce")
    cands += [split(top, s, mode) for s in (2, 4) for mode in modes]
    if not trim:
        cands.append(split(top, 2, "atomic"))
        if len(best) > 1:
            second = gemv_config(**best[1])
            cands += [split(second, s, "fixup") for s in (2, 4)]
    return [c for c in dict.fromkeys(cands) if fits(c, k)]


# ----------------------------------------------------------------------------------------
# Compiles in worker processes (they fill Triton's disk cache; the main process loads)

def _worker_init() -> None:
    os.environ.setdefault("TRITON_INTERPRET", "0")
    import torch
    import loom.kernels.gemv  # noqa: F401
    torch.cuda.init()


def _worker_compile(job):
    """Run the config once on a tiny weight of the same K (N = 64: the same divisibility
    specializations as every benchmarked N), which compiles it into the disk cache."""
    import torch
    from loom.kernels.gemv import GemvConfig, gemv
    m, k, silu, fields = job
    t0 = time.perf_counter()
    try:
        x = torch.randn(m, 2 * k if silu else k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
        gemv(x, w, silu_mul_input=silu, config=GemvConfig(**dict(fields)))
        torch.cuda.synchronize()
        return job, None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported, the config skipped
        return job, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", \
            time.perf_counter() - t0


def _worker_ping() -> int:
    time.sleep(0.5)  # keeps this worker busy so that the next ping starts another
    return os.getpid()


class Compiler:
    def __init__(self, jobs: int):
        self.pool = None
        self.failed: dict = {}
        self.seconds = 0.0
        if jobs > 1:
            import concurrent.futures as cf
            import multiprocessing as mp
            try:
                self.pool = cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"),
                                                   initializer=_worker_init)
                # Start every worker now (each imports torch and makes a CUDA context);
                # they are ready by the first stage's compiles.
                self.warming = [self.pool.submit(_worker_ping) for _ in range(jobs)]
            except Exception as e:  # noqa: BLE001
                log(f"note: no compile pool ({e}); compiling in the timing process")
                self.pool = None

    def run(self, jobs: list) -> None:
        jobs = [j for j in dict.fromkeys(jobs) if j not in self.failed]
        if self.pool is None or not jobs:
            return
        t0 = time.perf_counter()
        try:
            for job, err, _ in self.pool.map(_worker_compile, jobs, chunksize=1):
                if err:
                    self.failed[job] = err
        except Exception as e:  # noqa: BLE001
            log(f"note: compile pool failed ({type(e).__name__}: {e}); compiling in the "
                f"timing process from now on")
            self.pool.shutdown(cancel_futures=True)
            self.pool = None
        self.seconds += time.perf_counter() - t0
        log(f"  compiled {len(jobs)} configs in {time.perf_counter() - t0:.1f} s "
            f"({len(self.failed)} failed so far)")

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def job_key(m: int, k: int, silu: bool, cfg) -> tuple:
    """A compile job, hashable and picklable: (M, K, silu, the config's fields)."""
    return (m, k, silu, tuple(sorted(dataclasses.asdict(cfg).items())))


# ----------------------------------------------------------------------------------------
# Timing

def graph_us(torch, call) -> tuple[float, float]:
    """call(i) issues call i; CALLS_PER_GRAPH calls in one graph; (median, min) us per
    call over REPLAYS replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream (cuBLAS workspaces)
        for i in range(3):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS_PER_GRAPH):
            call(i)
    graph.replay()
    graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(REPLAYS)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    per_call = [s.elapsed_time(e) * 1e3 / CALLS_PER_GRAPH for s, e in events]
    del graph
    return statistics.median(per_call), min(per_call)


def close_enough(torch, y, ref) -> tuple[bool, float, float]:
    """bf16 tolerance: both sides round y to bf16 from float32 sums (~3e-3 of the norm)."""
    y32, r32 = y.float(), ref.float()
    if not bool(torch.isfinite(y32).all()):
        return False, float("nan"), float("nan")
    diff = y32 - r32
    norm = (diff.norm() / r32.norm()).item()
    worst = (diff.abs().max() / r32.abs().max()).item()
    return norm < 1e-2 and worst < 5e-2, norm, worst


class Shape:
    def __init__(self, name: str, n: int, k: int, silu: bool, pool_w):
        self.name, self.n, self.k, self.silu = name, n, k, silu
        self.weights = pool_w
        self.bytes = n * k * 2

    def inputs(self, torch, m):
        cols = 2 * self.k if self.silu else self.k
        return torch.randn(m, cols, device="cuda", dtype=torch.bfloat16)

    def torch_call(self, torch, F, x, w):
        if self.silu:
            return F.linear(F.silu(x[:, :self.k]) * x[:, self.k:], w)
        return F.linear(x, w)


def time_candidate(torch, F, gemv, shape: Shape, m: int, cfg, entry: dict) -> None:
    desc = cfg.describe()
    if desc in entry["candidates"]:
        return
    rec = {"config": dataclasses.asdict(cfg)}
    entry["candidates"][desc] = rec
    try:
        x = shape.inputs(torch, m)
        w = shape.weights[0]
        poison = torch.full((m, shape.n), float("nan"), device="cuda", dtype=torch.bfloat16)
        del poison  # y below most likely reuses its block: an unwritten element shows
        y = gemv(x, w, silu_mul_input=shape.silu, config=cfg)
        ok, norm, worst = close_enough(torch, y, shape.torch_call(torch, F, x, w))
        rec.update(err_norm=norm, err_max=worst)
        if not ok:
            rec["error"] = f"mismatch against F.linear: rel norm {norm:.2e}, max {worst:.2e}"
            log(f"  note: {shape.name} M={m} {desc}: {rec['error']}; skipped")
            return
        pool = shape.weights
        x = shape.inputs(torch, m)
        rec["us"], rec["min_us"] = graph_us(
            torch, lambda i: gemv(x, pool[i % len(pool)], silu_mul_input=shape.silu,
                                  config=cfg))
    except Exception as e:  # noqa: BLE001 - a config that fails is reported and skipped
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        log(f"  note: {shape.name} M={m} {desc}: {rec['error']}; skipped")


# ----------------------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output-json", required=True)
    ap.add_argument("--write-table", default=None, metavar="PATH",
                    help="merge the winners into this decode table (loom/kernels/configs/"
                    "gemv,dtype=bfloat16,device_name=<GPU>.json)")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated subset")
    ap.add_argument("--ms", default="1,2,4", help="batch sizes (1..8)")
    ap.add_argument("--jobs", type=int, default=max(1, min(16, (os.cpu_count() or 2) - 1)),
                    help="compile worker processes (1: compile in the timing process)")
    ap.add_argument("--budget-s", type=float, default=80.0,
                    help="soft wall-clock budget: later stages are trimmed or skipped")
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("gemv_bench: CUDA is not available; this benchmark needs an NVIDIA GPU",
              file=sys.stderr)
        return 2
    import torch.nn.functional as F
    import triton

    from loom.bench.ceilings import copy_bandwidth_tbps
    from loom.kernels.gemv import GemvConfig, gemv

    t_start = time.perf_counter()
    names = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in names if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    ms = [int(v) for v in args.ms.split(",")]
    if not all(1 <= m <= 8 for m in ms):
        ap.error(f"--ms takes batch sizes 1..8, got {ms}")
    torch.manual_seed(0)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    log(f"{props.name}: {props.multi_processor_count} SMs, L2 "
        f"{getattr(props, 'L2_cache_size', 0) / 2**20:.0f} MiB; torch {torch.__version__}, "
        f"triton {triton.__version__}")

    copy_tbps = copy_bandwidth_tbps(dev)
    src = torch.randn(1 << 29, device=dev, dtype=torch.bfloat16)
    sum_s = []
    for _ in range(6):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        src.sum(dtype=torch.float32)
        b.record()
        torch.cuda.synchronize()
        sum_s.append(a.elapsed_time(b) / 1e3)
    read_tbps = src.numel() * 2 / min(sum_s[1:]) / 1e12
    del src
    torch.cuda.empty_cache()
    log(f"copy rate {copy_tbps:.2f} TB/s (read + write); a bf16 sum reads at "
        f"{read_tbps:.2f} TB/s")

    compiler = Compiler(args.jobs)

    shapes: dict[str, Shape] = {}
    pools: dict[tuple[int, int], list] = {}
    for name in names:
        n, k, silu = SHAPES[name]
        if (n, k) not in pools:
            count = max(2, math.ceil(POOL_BYTES / (n * k * 2)))
            flat = torch.empty(count, n, k, device=dev, dtype=torch.bfloat16).normal_(0, 0.02)
            pools[(n, k)] = [flat[i] for i in range(count)]
        shapes[name] = Shape(name, n, k, silu, pools[(n, k)])

    results: dict[str, dict] = {}

    def entry(name, m):
        key = f"{name}/M{m}"
        if key not in results:
            s = shapes[name]
            results[key] = {"shape": name, "M": m, "N": s.n, "K": s.k, "silu_mul": s.silu,
                            "weight_bytes": s.bytes,
                            "floor_us": s.bytes / (copy_tbps * 1e12) * 1e6,
                            "weight_copies": len(s.weights), "candidates": {}}
        return results[key]

    def torch_baselines():
        """cuBLAS (and for down+silu the unfused silu * up + F.linear), every (shape, M)."""
        for name in names:
            s = shapes[name]
            for m in ms:
                e = entry(name, m)
                x = s.inputs(torch, m)
                pool = s.weights
                e["torch_us"], e["torch_min_us"] = graph_us(
                    torch, lambda i: s.torch_call(torch, F, x, pool[i % len(pool)]))

    def run_stage(label, plan, before_timing=None):
        """plan: list of (shape name, m, [configs])."""
        t0 = time.perf_counter()
        jobs = [job_key(m, shapes[name].k, shapes[name].silu, c)
                for name, m, cfgs in plan for c in cfgs]
        log(f"{label}: {len(plan)} (shape, M) pairs, {len(jobs)} timings, "
            f"{len(set(jobs))} distinct kernels")
        compiler.run(jobs)
        if before_timing is not None:
            before_timing()
        for name, m, cfgs in plan:
            s, e = shapes[name], entry(name, m)
            for c in cfgs:
                fail = compiler.failed.get(job_key(m, s.k, s.silu, c))
                if fail:
                    e["candidates"].setdefault(c.describe(), {
                        "config": dataclasses.asdict(c), "error": f"compile: {fail}"})
                    continue
                if time.perf_counter() - t_start > args.budget_s * 1.1:
                    e.setdefault("skipped_for_time", []).append(c.describe())
                    continue
                time_candidate(torch, F, gemv, s, m, c, e)
        log(f"  {label} done in {time.perf_counter() - t0:.1f} s "
            f"(total {time.perf_counter() - t_start:.1f} s)")

    k_of = {name: shapes[name].k for name in names}
    if 1 in ms:  # the baselines are timed once the compile workers are idle
        run_stage("stage 1 (M=1, all tiles)",
                  [(name, 1, stage1(GemvConfig, k_of[name])) for name in names],
                  before_timing=torch_baselines)
    else:
        torch_baselines()
    rest = [m for m in ms if m != 1]
    if rest:
        plan = []
        for name in names:
            for m in rest:
                if 1 in ms:
                    plan.append((name, m, stage2(GemvConfig, k_of[name], m, entry(name, 1))))
                else:
                    plan.append((name, m, [c for c in stage1(GemvConfig, k_of[name])
                                           if c.use_dot or (c.block_n, c.block_k, c.num_warps)
                                           in set(fma_tiles(m))]))
        run_stage("stage 2 (M>1: best M=1 tiles, dot tiles)", plan)
    elapsed = time.perf_counter() - t_start
    if elapsed < args.budget_s * 0.85:
        trim = elapsed > args.budget_s * 0.55
        plan = [(name, m, stage3(GemvConfig, k_of[name], entry(name, m), trim))
                for name in names for m in ms]
        run_stage(f"stage 3 (stages, split-K{'; trimmed for time' if trim else ''})", plan)
    else:
        log(f"stage 3 skipped: {elapsed:.0f} s of the {args.budget_s:.0f} s budget spent")
    compiler.close()

    # Summary.
    log("")
    log(f"copy rate {copy_tbps:.2f} TB/s; eff = floor / time (floor = weight bytes / copy "
        f"rate); {CALLS_PER_GRAPH} calls a graph, median of {REPLAYS} replays")
    log(f"{'shape':10} {'M':>2} {'MB':>6} {'floor':>7} | {'cuBLAS':>8} {'eff':>5} | "
        f"{'Triton':>8} {'eff':>5} {'speedup':>7} | best config")
    for e in results.values():
        best = ranked(e)
        e["best"] = None
        e["torch_eff"] = e["floor_us"] / e["torch_us"]
        line = (f"{e['shape']:10} {e['M']:>2} {e['weight_bytes'] / 1e6:6.1f} "
                f"{e['floor_us']:6.2f}u | {e['torch_us']:7.2f}u {e['torch_eff']:5.2f} |")
        if best:
            us, cfg = best[0]
            desc = GemvConfig(**cfg).describe()
            e["best"] = {"us": us, "config": cfg, "describe": desc,
                         "eff": e["floor_us"] / us, "speedup_vs_torch": e["torch_us"] / us}
            line += (f" {us:7.2f}u {e['floor_us'] / us:5.2f} {e['torch_us'] / us:6.2f}x | "
                     f"{desc}")
            unsplit = [u for u, c in best if c["split_k"] == 1]
            if unsplit and unsplit[0] != us:
                line += f"  (best unsplit: {unsplit[0]:.2f}u)"
        else:
            line += " no Triton candidate passed"
        log(line)
    log("")
    log("best per family (us): reg = row reductions from register loads (num_stages 1), "
        "pipe = the same through an async-copy pipeline, dot = tensor cores; split = any "
        "with split_k > 1")
    for e in results.values():
        fams = {}
        for us, cfg in ranked(e):
            fam = ("split" if cfg["split_k"] > 1 else "dot" if cfg["use_dot"]
                   else "reg" if cfg["num_stages"] == 1 else "pipe")
            fams.setdefault(fam, us)
        e["best_by_family_us"] = fams
        log(f"{e['shape']:10} {e['M']:>2}  " + "  ".join(
            f"{fam} {fams[fam]:7.2f}" if fam in fams else f"{fam} {'-':>7}"
            for fam in ("reg", "pipe", "dot", "split")))
    if "down+silu" in names:
        log("down+silu: the torch column is F.silu(gate) * up then F.linear (3 kernels); "
            "the Triton one is the fused kernel")

    out = {
        "device": torch.cuda.get_device_name(dev),
        "sm_count": props.multi_processor_count,
        "git_commit": os.environ.get("LOOM_GIT_COMMIT"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "torch": torch.__version__, "triton": triton.__version__,
        "ceilings": {"copy_tb_per_s": copy_tbps, "bf16_sum_read_tb_per_s": read_tbps},
        "method": {"calls_per_graph": CALLS_PER_GRAPH, "replays": REPLAYS,
                   "statistic": "median over replays / calls_per_graph",
                   "weight_pool_bytes_min": POOL_BYTES,
                   "eff": "floor_us / us; floor_us = weight bytes / copy rate"},
        "profiled_cublas_us_m1": PROFILED_CUBLAS_US,
        "compile_seconds_in_pool": compiler.seconds,
        "compile_failures": [{"job": str(k), "error": v} for k, v in compiler.failed.items()],
        "wall_seconds": time.perf_counter() - t_start,
        "results": results,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
    with open(args.output_json, "w") as f:
        json.dump(out, f, indent=1)
    log(f"wrote {args.output_json} ({out['wall_seconds']:.0f} s)")
    if args.write_table:
        log(f"wrote {write_table(results, args.write_table)}")
    return 0


def write_table(results: dict, path: str, margin: float = 0.98) -> str:
    """Merge the winners into loom's decode table (loom.kernels.gemv_decode.tuned_config reads
    it): per (N, K) and M, the fastest unsplit config that checked out, only where it beat
    F.linear by more than the margin; fused-SwiGLU rows are not used by the model."""
    table = json.load(open(path)) if os.path.exists(path) else {}
    for r in results.values():
        if r["silu_mul"]:
            continue
        ok = [c for c in r["candidates"].values()
              if c.get("us") and c["config"]["split_k"] == 1 and c.get("err_norm", 1) < 1e-2]
        if not ok:
            continue
        best = min(ok, key=lambda c: c["us"])
        per_m = table.setdefault(f"{r['N']},{r['K']}", {})
        if best["us"] < r["torch_us"] * margin:
            per_m[str(r["M"])] = {k: v for k, v in best["config"].items()
                                  if k not in ("split_k", "split_mode")}
        else:
            per_m.pop(str(r["M"]), None)
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
    return path


if __name__ == "__main__":
    sys.exit(main())
