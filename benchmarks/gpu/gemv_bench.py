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

--weight-dtype fp8 measures the table for fp8 weights (gemv,dtype=float8_e4m3fn,...): each
copy quantized per row (loom.quantization.fp8.quantize_rows) from the same normal(0, 0.02)
bf16 weights, with its float32 scale per row, and x bf16 as in loom (W8A16: the GEMV's
weight_scale). The baseline is what loom runs where the table has no config,
`scaled_mm_linear` (x quantized per token, then torch._scaled_mm; down+silu: `silu_mul`
first); candidates are checked against the float32 product act @ (w * scale)^T, not the
baseline, which quantizes x. The floor counts a byte a weight plus the 4-byte scales; the
pool holds twice the copies; the row-reduction tiles go to 2048-wide chunks and the dot
tiles to twice bf16's (the same bytes a chunk).

This file holds the command line and the staged run; gemv_search.py beside it the
candidates of each stage and the compile pool; gemv_timing.py the timing of one candidate,
the summary lines and the decode table (--write-table).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
if HERE not in sys.path:  # gemv_search and gemv_timing, for this process and the workers
    sys.path.insert(0, HERE)
os.environ.setdefault("TRITON_INTERPRET", "0")

from gemv_search import (Compiler, job_key, stage1, stage2,  # noqa: E402
                         stage2_without_m1, stage3)
from gemv_timing import (CALLS_PER_GRAPH, POOL_BYTES, REPLAYS, Shape,  # noqa: E402
                         graph_us, log, log_summary, time_candidate, write_table)

from loom.kernels.gemv import MAX_M  # noqa: E402

WEIGHT_DTYPES = {"bf16": "bfloat16", "fp8": "float8_e4m3fn"}
"""--weight-dtype: the torch dtype's name (in the table's file name)."""

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
    # what the model runs for down where its config reduces rows: time it beside down1
    # (with tensor-core tiles the model runs SiLU·mul first, then down1's GEMV)
    "down1+silu": (4096, 14336, True),
    # Llama-3.1-70B on one GPU, as -q fp8 fits it (--weight-dtype fp8 --shapes
    # qkv70,o70,gate_up70,down70)
    "qkv70": (10240, 8192, False),
    "o70": (8192, 8192, False),
    "gate_up70": (57344, 8192, False),
    "down70": (8192, 28672, False),
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


# ----------------------------------------------------------------------------------------
# The command line and the setup

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--output-json", required=True)
    ap.add_argument("--write-table", default=None, metavar="PATH",
                    help="merge the winners into this decode table (loom/kernels/configs/"
                    "gemv,dtype=bfloat16,device_name=<GPU>.json; with --weight-dtype fp8 "
                    "gemv,dtype=float8_e4m3fn,device_name=<GPU>.json)")
    ap.add_argument("--weight-dtype", choices=tuple(WEIGHT_DTYPES), default="bf16",
                    help="the weights' dtype: bf16 (against F.linear), or fp8 e4m3 with a "
                    "float32 scale per row (against scaled_mm_linear; W8A16 GEMV)")
    ap.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma-separated subset")
    ap.add_argument("--ms", default="1,2,4", help=f"batch sizes (1..{MAX_M})")
    ap.add_argument("--jobs", type=int, default=max(1, min(16, (os.cpu_count() or 2) - 1)),
                    help="compile worker processes (1: compile in the timing process)")
    ap.add_argument("--budget-s", type=float, default=80.0,
                    help="soft wall-clock budget: later stages are trimmed or skipped")
    return ap


def checked_shapes_and_ms(ap: argparse.ArgumentParser, args) -> tuple[list[str], list[int]]:
    """--shapes and --ms as lists; a bad value exits through ap.error."""
    names = [s for s in args.shapes.split(",") if s]
    unknown = [s for s in names if s not in SHAPES]
    if unknown:
        ap.error(f"unknown shapes {unknown}; known: {list(SHAPES)}")
    ms = [int(v) for v in args.ms.split(",")]
    if not all(1 <= m <= MAX_M for m in ms):
        ap.error(f"--ms takes batch sizes 1..{MAX_M}, got {ms}")
    table = os.path.basename(args.write_table or "")
    want = f"dtype={WEIGHT_DTYPES[args.weight_dtype]},"
    if "dtype=" in table and want not in table:
        ap.error(f"--write-table {table} is not the table of --weight-dtype "
                 f"{args.weight_dtype} ({want[:-1]})")
    return names, ms


def measure_rates(torch, dev) -> tuple[float, float]:
    """The copy rate (the floors' denominator) and, for context, a bf16 sum's read rate."""
    from loom.bench.ceilings import copy_bandwidth_tbps

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
    return copy_tbps, read_tbps


def build_shapes(torch, dev, names: list[str], fp8: bool = False) -> dict[str, Shape]:
    """Each shape with its pool of weight copies (> POOL_BYTES, shared by equal N x K); fp8:
    each copy quantized per row, with its float32 scales [N, 1] (twice the copies)."""
    shapes: dict[str, Shape] = {}
    pools: dict[tuple[int, int], tuple[list, list | None]] = {}
    for name in names:
        n, k, silu = SHAPES[name]
        if (n, k) not in pools:
            count = max(2, math.ceil(POOL_BYTES / (n * k * (1 if fp8 else 2))))
            flat = torch.empty(count, n, k, device=dev, dtype=torch.bfloat16).normal_(0, 0.02)
            scales = None
            if fp8:
                from loom.quantization.fp8 import quantize_rows
                q = torch.empty(count, n, k, device=dev, dtype=torch.float8_e4m3fn)
                sc = torch.empty(count, n, 1, device=dev, dtype=torch.float32)
                for i in range(count):
                    q[i], sc[i] = quantize_rows(flat[i])
                flat, scales = q, [sc[i] for i in range(count)]
            pools[(n, k)] = ([flat[i] for i in range(count)], scales)
        shapes[name] = Shape(name, n, k, silu, *pools[(n, k)])
    return shapes


# ----------------------------------------------------------------------------------------
# The staged run

@dataclasses.dataclass
class Run:
    """One run's shapes, batch sizes and compile pool, its clock, and its results by
    "shape/M"."""
    torch: Any
    F: Any
    gemv: Any
    gemv_config: type
    names: list[str]
    ms: list[int]
    shapes: dict[str, Shape]
    copy_tbps: float
    budget_s: float
    compiler: Compiler
    t_start: float
    weight_dtype: str = "bf16"
    results: dict[str, dict] = dataclasses.field(default_factory=dict)

    @property
    def w_bytes(self) -> int:
        return 1 if self.weight_dtype == "fp8" else 2

    def job(self, s: Shape, m: int, c) -> tuple:
        return job_key(m, s.k, s.silu, c, self.weight_dtype)

    def entry(self, name: str, m: int) -> dict:
        key = f"{name}/M{m}"
        if key not in self.results:
            s = self.shapes[name]
            self.results[key] = {"shape": name, "M": m, "N": s.n, "K": s.k,
                                 "silu_mul": s.silu, "weight_bytes": s.bytes,
                                 "floor_us": s.bytes / (self.copy_tbps * 1e12) * 1e6,
                                 "weight_copies": len(s.weights), "candidates": {}}
        return self.results[key]

    def torch_baselines(self) -> None:
        """cuBLAS (and for down+silu the unfused silu * up + F.linear), every (shape, M); for
        fp8 weights scaled_mm_linear (after silu_mul)."""
        torch, F = self.torch, self.F
        for name in self.names:
            s = self.shapes[name]
            for m in self.ms:
                e = self.entry(name, m)
                x = s.inputs(torch, m)
                e["torch_us"], e["torch_min_us"] = graph_us(
                    torch, lambda i: s.torch_call(torch, F, x, i))

    def run_stage(self, label: str, plan: list, before_timing=None) -> None:
        """plan: list of (shape name, m, [configs])."""
        t0 = time.perf_counter()
        jobs = [self.job(self.shapes[name], m, c) for name, m, cfgs in plan for c in cfgs]
        log(f"{label}: {len(plan)} (shape, M) pairs, {len(jobs)} timings, "
            f"{len(set(jobs))} distinct kernels")
        self.compiler.run(jobs)
        if before_timing is not None:
            before_timing()
        for name, m, cfgs in plan:
            s, e = self.shapes[name], self.entry(name, m)
            for c in cfgs:
                self.try_candidate(s, m, c, e)
        log(f"  {label} done in {time.perf_counter() - t0:.1f} s "
            f"(total {time.perf_counter() - self.t_start:.1f} s)")

    def try_candidate(self, s: Shape, m: int, c, e: dict) -> None:
        """Time c, unless its compile failed or the run is past 110 % of its budget."""
        fail = self.compiler.failed.get(self.job(s, m, c))
        if fail:
            e["candidates"].setdefault(c.describe(), {
                "config": dataclasses.asdict(c), "error": f"compile: {fail}"})
            return
        if time.perf_counter() - self.t_start > self.budget_s * 1.1:
            e.setdefault("skipped_for_time", []).append(c.describe())
            return
        time_candidate(self.torch, self.F, self.gemv, s, m, c, e)


def run_stages(run: Run) -> None:
    """Stage 1 (M = 1, with the cuBLAS baselines), stage 2 (M > 1), then stage 3 as the
    budget allows."""
    cfg, names, ms, wb = run.gemv_config, run.names, run.ms, run.w_bytes
    k_of = {name: run.shapes[name].k for name in names}
    if 1 in ms:  # the baselines are timed once the compile workers are idle
        run.run_stage("stage 1 (M=1, all tiles)",
                      [(name, 1, stage1(cfg, k_of[name], wb)) for name in names],
                      before_timing=run.torch_baselines)
    else:
        run.torch_baselines()
    rest = [m for m in ms if m != 1]
    if rest:
        plan = [(name, m, stage2(cfg, k_of[name], m, run.entry(name, 1), wb) if 1 in ms
                 else stage2_without_m1(cfg, k_of[name], m, wb))
                for name in names for m in rest]
        run.run_stage("stage 2 (M>1: best M=1 tiles, dot tiles)", plan)
    elapsed = time.perf_counter() - run.t_start
    if elapsed < run.budget_s * 0.85:
        trim = elapsed > run.budget_s * 0.55
        plan = [(name, m, stage3(cfg, k_of[name], run.entry(name, m), trim, wb))
                for name in names for m in ms]
        run.run_stage(f"stage 3 (stages, split-K{'; trimmed for time' if trim else ''})", plan)
    else:
        log(f"stage 3 skipped: {elapsed:.0f} s of the {run.budget_s:.0f} s budget spent")
    run.compiler.close()


# ----------------------------------------------------------------------------------------
# The JSON

def run_record(run: Run, props, triton_version: str, read_tbps: float, table: str) -> dict:
    torch = run.torch
    fp8 = run.weight_dtype == "fp8"
    return {
        "device": torch.cuda.get_device_name(torch.device("cuda")),
        "weight_dtype": WEIGHT_DTYPES[run.weight_dtype],
        "decode_table": table,
        "sm_count": props.multi_processor_count,
        "git_commit": os.environ.get("LOOM_GIT_COMMIT"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "torch": torch.__version__, "triton": triton_version,
        "ceilings": {"copy_tb_per_s": run.copy_tbps, "bf16_sum_read_tb_per_s": read_tbps},
        "method": {"calls_per_graph": CALLS_PER_GRAPH, "replays": REPLAYS,
                   "statistic": "median over replays / calls_per_graph",
                   "weight_pool_bytes_min": POOL_BYTES,
                   "eff": "floor_us / us; floor_us = weight bytes / copy rate" + (
                       " (fp8: N*K + the 4*N scale bytes)" if fp8 else ""),
                   "baseline": "scaled_mm_linear (silu_mul first for +silu)" if fp8
                   else "F.linear (F.silu(gate) * up first for +silu)",
                   "check": "against act.float() @ (w.float() * scale).T" if fp8
                   else "against the baseline"},
        "profiled_cublas_us_m1": None if fp8 else PROFILED_CUBLAS_US,
        "compile_seconds_in_pool": run.compiler.seconds,
        "compile_failures": [{"job": str(k), "error": v}
                             for k, v in run.compiler.failed.items()],
        "wall_seconds": time.perf_counter() - run.t_start,
        "results": run.results,
    }


def write_json(path: str, out: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    log(f"wrote {path} ({out['wall_seconds']:.0f} s)")


# ----------------------------------------------------------------------------------------

def main() -> int:
    ap = build_parser()
    args = ap.parse_args()

    import torch
    if not torch.cuda.is_available():
        print("gemv_bench: CUDA is not available; this benchmark needs an NVIDIA GPU",
              file=sys.stderr)
        return 2
    import torch.nn.functional as F
    import triton

    from loom.kernels.gemv import GemvConfig, gemv
    from loom.kernels.gemv_decode import table_path
    from loom.kernels.tuned import device_name

    t_start = time.perf_counter()
    names, ms = checked_shapes_and_ms(ap, args)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    fp8 = args.weight_dtype == "fp8"
    table = str(table_path(getattr(torch, WEIGHT_DTYPES[args.weight_dtype]), device_name(dev)))
    log(f"{props.name}: {props.multi_processor_count} SMs, L2 "
        f"{getattr(props, 'L2_cache_size', 0) / 2**20:.0f} MiB; torch {torch.__version__}, "
        f"triton {triton.__version__}; {args.weight_dtype} weights (loom's table for them "
        f"here: {table})")
    copy_tbps, read_tbps = measure_rates(torch, dev)
    compiler = Compiler(args.jobs)
    run = Run(torch, F, gemv, GemvConfig, names, ms, build_shapes(torch, dev, names, fp8),
              copy_tbps, args.budget_s, compiler, t_start, args.weight_dtype)
    run_stages(run)
    log_summary(run.results, GemvConfig, copy_tbps, names, fp8)
    write_json(args.output_json, run_record(run, props, triton.__version__, read_tbps, table))
    if args.write_table:
        log(f"wrote {write_table(run.results, args.write_table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
