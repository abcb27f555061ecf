"""`loom bench sweep`: the seed's serving workload in one command.

For each frontend mode (multiprocess, and in-process: `--disable-frontend-multiprocessing`)
it starts `loom serve --model M [--tokenizer T] <engine flags after -->`, waits for /health,
runs the serving benchmark at each rate for `--duration` seconds (num_prompts = rate x
duration; `inf` sends `--inf-num-prompts` at once), stops the server, and prints one table of
mean TTFT and mean TPOT per rate and mode, plus output throughput at `inf` (with
`--compute-floor`, its ratio to the compute floor). By default one server serves all rates
of a mode (model load and compilation happen once); `--restart-per-rate` starts a fresh one
for every rate. Each rate draws its own prompts
(seed + rate index), so prefix caching cannot carry over from one rate to the next; both modes
see the same prompts at a given rate.

Saved under --result-dir: one JSON (and PNG with --plot) per run, each server's log, and
sweep.json with the table.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from loom.bench.common import (
    command_line,
    default_tokenizer,
    git_commit,
    now_iso,
    write_json,
)
from loom.bench import server_latency
from loom.bench.serve import ServeBenchConfig, add_workload_args, run_benchmark
from loom.bench.server_process import ServerSpec, running_server

MODES = {"multiprocess": False, "inprocess": True}
"""mode name -> --disable-frontend-multiprocessing."""


def register(subparsers) -> None:
    p = subparsers.add_parser("sweep", help="serve benchmark at several rates, both frontend modes",
                              description="Engine flags for `loom serve` go after `--`.")
    g = p.add_argument_group("sweep")
    g.add_argument("--model", required=True, help="model for `loom serve` (path or shipped config)")
    g.add_argument("--tokenizer", default=None,
                   help="default: the model's (Llama 3 for shipped Llama configs)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=0, help="0: a free port")
    g.add_argument("--rates", default="2,6,10,14",
                   help="requests per second, comma-separated; inf sends every prompt at once")
    g.add_argument("--inf-num-prompts", type=int, default=1000,
                   help="prompts of a rate of inf")
    g.add_argument("--compute-floor", action="store_true",
                   help="at a rate of inf, measure the matmul rate here and report output "
                   "throughput against the compute floor of --model (a shipped config)")
    g.add_argument("--modes", default="multiprocess,inprocess",
                   help=f"comma-separated, from {', '.join(MODES)}")
    g.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per rate")
    g.add_argument("--restart-per-rate", action="store_true", help="a fresh server for every rate")
    g.add_argument("--server-timeout", type=float, default=900.0,
                   help="seconds to wait for /health after starting the server")
    g.add_argument("--stop-timeout", type=float, default=30.0,
                   help="seconds to wait for a clean exit before killing the server")
    add_workload_args(p, result_dir=None)
    p.add_argument("server_args", nargs=argparse.REMAINDER, help="-- then `loom serve` engine flags")
    p.set_defaults(func=run_sweep)


@dataclass(frozen=True)
class SweepPlan:
    rates: tuple[float, ...]
    modes: tuple[str, ...]
    duration_s: float
    result_dir: Path
    spec: ServerSpec
    base: ServeBenchConfig
    """Everything but base_url, rate, prompt count and seed, which each run sets."""
    restart_per_rate: bool
    inf_num_prompts: int = 1000
    compute_floor: bool = False


def _plan(args: argparse.Namespace) -> SweepPlan:
    try:
        rates = tuple(float(r) for r in args.rates.split(",") if r.strip())
    except ValueError as e:
        raise ValueError(f"rates: {args.rates!r} is not a comma-separated list of numbers") from e
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not rates or any(not r > 0 for r in rates):  # also refuses nan
        raise ValueError(f"rates: need positive request rates, got {args.rates!r}")
    if not modes or set(modes) - set(MODES):
        raise ValueError(f"modes: choose from {list(MODES)}, got {args.modes!r}")
    if args.duration <= 0:
        raise ValueError(f"duration: must be positive, got {args.duration}")
    if args.inf_num_prompts <= 0:
        raise ValueError(f"inf_num_prompts: must be positive, got {args.inf_num_prompts}")
    tokenizer = args.tokenizer or default_tokenizer(args.model)
    if tokenizer is None:  # the server could not tokenize the text prompts either
        raise ValueError(f"tokenizer: {args.model} ships no tokenizer; pass --tokenizer")
    extra = list(args.server_args)
    if extra and extra[0] == "--":
        extra = extra[1:]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    result_dir = Path(args.result_dir or f"benchmarks/results/sweep-{stamp}")
    spec = ServerSpec(args.model, tokenizer, args.host, args.port, extra_args=tuple(extra),
                      start_timeout_s=args.server_timeout, stop_timeout_s=args.stop_timeout)
    ns = argparse.Namespace(**{**vars(args), "base_url": "http://unset", "model": None,
                               "tokenizer": tokenizer, "num_prompts": 1, "request_rate": 1.0,
                               "save_result": True, "result_dir": str(result_dir),
                               "result_filename": None, "compute_floor": False,
                               "tensor_parallel_size": 1, "lora_modules": None})
    return SweepPlan(rates, modes, args.duration, result_dir, spec, ServeBenchConfig.from_args(ns),
                     args.restart_per_rate, args.inf_num_prompts, args.compute_floor)


def run_sweep(args: argparse.Namespace) -> int:
    plan = _plan(args)
    results: dict[tuple[str, float], dict[str, Any]] = {}
    errors: dict[str, str] = {}
    with _sigterm_exits():
        for mode in plan.modes:
            try:
                _run_mode(plan, mode, results)
            except RuntimeError as e:  # the server would not start, or died: go on to the next mode
                errors[mode] = str(e)
                print(f"sweep: mode {mode} stopped: {e}", file=sys.stderr)
    rows = table_rows(plan, results)
    print_table(plan, rows)
    summary = {"benchmark": "sweep", "date": now_iso(), "git_commit": git_commit(),
               "command": command_line(), "server_model": plan.spec.model,
               "server_tokenizer": plan.spec.tokenizer, "server_args": plan.spec.extra_args,
               "duration_s": plan.duration_s, "rates": plan.rates, "modes": plan.modes,
               "table": rows, "errors": errors,
               "runs": [dict(v, mode=m, rate=r) for (m, r), v in results.items()]}
    print(f"Wrote {write_json(plan.result_dir / 'sweep.json', summary)}")
    complete = len(results) == len(plan.rates) * len(plan.modes)
    return 0 if complete and all(v["completed"] > 0 for v in results.values()) else 1


def _num_prompts(plan: SweepPlan, rate: float) -> int:
    if math.isinf(rate):
        return plan.inf_num_prompts
    return max(1, round(rate * plan.duration_s))


def _run_mode(plan: SweepPlan, mode: str, results: dict) -> None:
    spec = replace(plan.spec, inproc=MODES[mode])
    groups = [[r] for r in plan.rates] if plan.restart_per_rate else [list(plan.rates)]
    for group in groups:
        tag = f"{mode}-{group[0]:g}qps" if plan.restart_per_rate else mode
        log = plan.result_dir / f"server-{tag}.log"
        print(f"Starting loom serve ({mode}); log {log}; waiting up to "
              f"{spec.start_timeout_s:g} s for /health", flush=True)
        with running_server(spec, log) as base_url:
            for rate in group:
                results[(mode, rate)] = _run_rate(plan, mode, rate, base_url)


def _run_rate(plan: SweepPlan, mode: str, rate: float, base_url: str) -> dict[str, Any]:
    index = plan.rates.index(rate)
    n = _num_prompts(plan, rate)
    dataset = replace(plan.base.dataset, num_prompts=n, seed=plan.base.dataset.seed + index)
    cfg = replace(plan.base, base_url=base_url, request_rate=rate, dataset=dataset,
                  result_filename=f"serve-{mode}-{rate:g}qps.json",
                  extra_info={"sweep_mode": mode, "sweep_duration_s": plan.duration_s})
    if math.isinf(rate) and plan.compute_floor:
        cfg = replace(cfg, compute_floor=True, model=plan.spec.model,
                      tensor_parallel_size=_server_tp(plan.spec.extra_args))
    print(f"\n===== {mode}: {rate:g} req/s, {n} prompts =====")
    # Read after the benchmark's untimed probe: the server's means then cover exactly the
    # requests the client timed (the probe, the first to a fresh server, can be the slowest).
    readings = []
    cfg = replace(cfg, after_probe=lambda: readings.append(server_latency.read_totals(base_url)))
    run = run_benchmark(cfg)
    server_ms = server_latency.mean_ms(readings[0] if readings else None,
                                       server_latency.read_totals(base_url))
    if server_ms is not None:
        print(server_latency.describe(server_ms))
    m, floor = run.metrics, (run.result or {}).get("compute_floor")
    return {"completed": m.completed, "failed": m.failed, "duration_s": m.duration_s,
            "server_mean_ms": server_ms, "mean_ttft_ms": m.stats["ttft"].mean_ms,
            "mean_tpot_ms": m.stats["tpot"].mean_ms,
            "output_throughput": m.output_throughput, "result": f"serve-{mode}-{rate:g}qps.json",
            "duration_ratio_to_floor": floor["duration_ratio_to_floor"] if floor else None}


def _server_tp(server_args: tuple[str, ...]) -> int:
    """The server's -tp, for the compute floor (1 unless given)."""
    for i, arg in enumerate(server_args):
        if arg in ("-tp", "--tensor-parallel-size") and i + 1 < len(server_args):
            return int(server_args[i + 1])
        if arg.startswith("--tensor-parallel-size="):
            return int(arg.split("=", 1)[1])
    return 1


def table_rows(plan: SweepPlan, results: dict) -> list[dict[str, Any]]:
    rows = []
    for rate in plan.rates:
        row: dict[str, Any] = {"rate": rate}
        for mode in plan.modes:
            r = results.get((mode, rate))
            row[mode] = None if r is None else {k: r.get(k) for k in (
                "mean_ttft_ms", "mean_tpot_ms", "failed", "output_throughput",
                "duration_ratio_to_floor")}
        rows.append(row)
    return rows


def print_table(plan: SweepPlan, rows: list[dict[str, Any]]) -> None:
    header = f"{'rate (req/s)':>12}" + "".join(f" | {m + ' TTFT':>22} | {m + ' TPOT':>22}"
                                               for m in plan.modes)
    print(f"\nMean TTFT and mean TPOT (ms), {plan.duration_s:g} s per rate")
    print(header)
    print("-" * len(header))
    for row in rows:
        cells = "".join(_cells(row[m]) for m in plan.modes)
        print(f"{row['rate']:>12g}{cells}")
    for row in rows:
        if not math.isinf(row["rate"]):
            continue
        for mode in plan.modes:
            r = row[mode]
            if r is None:
                continue
            ratio = (f", {r['duration_ratio_to_floor']:.2f}x the compute floor"
                     if r.get("duration_ratio_to_floor") else "")
            print(f"{mode} at rate inf ({plan.inf_num_prompts} prompts): output throughput "
                  f"{r['output_throughput']:.1f} tokens/s{ratio}")


def _cells(r: dict[str, Any] | None) -> str:
    if r is None:
        return f" | {'-':>22} | {'-':>22}"
    failed = f" ({r['failed']} failed)" if r["failed"] else ""
    return f" | {r['mean_ttft_ms']:>22.2f} | {r['mean_tpot_ms']:>22.2f}{failed}"


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """A SIGTERM unwinds like Ctrl-C, so that every started server is stopped on the way out."""
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
