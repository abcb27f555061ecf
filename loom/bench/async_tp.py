"""`loom bench async-tp`: the seed's async-TP table in one command.

For each input length and graph kind (`static`: `compile_sizes: [N]`; `dynamic`: none) it
runs `loom bench latency -tp T --input-len N --output-len 1 --batch-size 1` once with
`pass_config.enable_async_tp` false ("off") and once per implementation named in `--impls`
with it true (`LOOM_ASYNC_TP_IMPL`), each a fresh process, `--repeats` times with the
variants interleaved (off, on, off, on...) so that drift hits both alike. Engine flags after
`--` go to every run (e.g. `--load-format dummy --max-model-len 9000`).

It prints one table, every cell the mean over repeats with the repeats beside it and the
ratio to "off" of the same row, and saves each run's JSON and log plus table.json under
--result-dir. `--whole-graph-off` adds an "off" column compiled as one graph
(`splitting_ops: []`), the graph shape the passes compile, so the passes' effect can be
told from the graph's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loom import envs
from loom.bench.common import command_line, git_commit, now_iso, write_json
from loom.config import CompilationConfig

GRAPHS = ("static", "dynamic")
IMPLS = envs.ASYNC_TP_IMPLS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "async-tp", help="the seed's table: prefill latency with async TP on and off",
        description="Engine flags for every `loom bench latency` run go after `--`.")
    p.add_argument("--model", required=True)
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=2)
    p.add_argument("--input-lens", default="2048,8192", help="comma-separated token counts")
    p.add_argument("--graphs", default="static,dynamic",
                   help="static (compile_sizes [N]) and/or dynamic (no compile_sizes)")
    p.add_argument("--impls", default=None,
                   help="async-TP implementations to run on (LOOM_ASYNC_TP_IMPL): "
                        "symm_mem, p2p, overlap; default: LOOM_ASYNC_TP_IMPL's value")
    p.add_argument("--whole-graph-off", action="store_true",
                   help="also run off with splitting_ops [] (one graph, as the passes compile)")
    p.add_argument("-O", "--compilation-config", default=None,
                   help="a JSON object every run's -O starts from (e.g. "
                        "'{\"cudagraph_mode\":\"FULL_AND_PIECEWISE\"}'); the table's own keys "
                        "(level, compile_sizes, pass_config, splitting_ops) override it")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--num-iters-warmup", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=15)
    p.add_argument("--run-timeout", type=float, default=900.0, help="seconds per run")
    p.add_argument("--result-dir", default="async-tp-results")
    p.add_argument("engine_args", nargs=argparse.REMAINDER,
                   help="-- then flags for `loom bench latency` (engine flags)")
    p.set_defaults(func=run_async_tp)


@dataclass(frozen=True)
class Variant:
    name: str
    """Column name: off, off-whole, or the implementation."""
    async_tp: bool
    impl: str
    whole_graph: bool = False

    def compilation(self, input_len: int, graph: str,
                    base: dict[str, Any] | None = None) -> dict[str, Any]:
        config: dict[str, Any] = {**(base or {}), "level": 3}
        if graph == "static":
            config["compile_sizes"] = [input_len]
        if self.whole_graph:
            config["splitting_ops"] = []
        config["pass_config"] = {"enable_async_tp": self.async_tp}
        return config


def _csv(text: str, what: str, allowed: tuple[str, ...] | None = None) -> list[str]:
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise ValueError(f"{what}: expected a comma-separated list, got {text!r}")
    bad = [s for s in items if allowed is not None and s not in allowed]
    if bad:
        raise ValueError(f"{what}: unknown {bad}; known: {list(allowed)}")
    return items


def _base_config(text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    CompilationConfig.parse(text)  # every CLI's -O checks and messages
    value = json.loads(text)
    if not isinstance(value, dict):  # a bare level: the table sets the level itself
        raise ValueError(f"compilation_config: expected a JSON object, got {text!r}")
    return value


def _plan(args: argparse.Namespace) -> tuple[list[int], list[str], list[Variant]]:
    try:
        lens = [int(s) for s in _csv(args.input_lens, "input_lens")]
    except ValueError as e:
        raise ValueError(f"input_lens: {e}") from None
    if any(n <= 0 for n in lens):
        raise ValueError(f"input_lens: must be positive, got {lens}")
    if args.repeats <= 0 or args.num_iters <= 0 or args.num_iters_warmup < 0:
        raise ValueError("repeats and num_iters must be positive, num_iters_warmup >= 0")
    if args.tensor_parallel_size < 2:
        raise ValueError(f"tensor_parallel_size: async TP needs at least 2, got "
                         f"{args.tensor_parallel_size}")
    graphs = _csv(args.graphs, "graphs", GRAPHS)
    _base_config(args.compilation_config)  # a bad -O fails before any run
    variants = [Variant("off", False, "symm_mem")]
    if args.whole_graph_off:
        variants.append(Variant("off-whole", False, "symm_mem", whole_graph=True))
    impls = _csv(args.impls or envs.async_tp_impl(), "impls", IMPLS)
    variants += [Variant(impl, True, impl) for impl in impls]
    return lens, graphs, variants


def run_async_tp(args: argparse.Namespace) -> int:
    lens, graphs, variants = _plan(args)
    engine = list(args.engine_args)
    if engine and engine[0] == "--":
        engine = engine[1:]
    check_devices(args.tensor_parallel_size, engine)
    out_dir = Path(args.result_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in lens:
        for graph in graphs:
            runs: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
            for r in range(args.repeats):
                for v in variants:
                    runs[v.name].append(_run_one(args, engine, out_dir, n, graph, v, r))
            rows.append(_row(n, graph, variants, runs))
            _print_row(rows[-1], variants)
    table = {"benchmark": "async-tp", "date": now_iso(), "git_commit": git_commit(),
             "command": command_line(), "tensor_parallel_size": args.tensor_parallel_size,
             "model": args.model, "engine_args": engine, "repeats": args.repeats,
             "num_iters_warmup": args.num_iters_warmup, "num_iters": args.num_iters,
             "device": rows[0]["device"] if rows else None, "rows": rows}
    print()
    print_table(rows, variants)
    print(f"Wrote {write_json(out_dir / 'table.json', table)}")
    runs = [run for row in rows for cell in row["cells"].values() for run in cell["runs"]]
    if all("error" in run for run in runs):
        print(f"loom bench async-tp: all {len(runs)} runs failed; their logs are in "
              f"{out_dir}", file=sys.stderr)
        return 1
    return 0


def check_devices(tp: int, engine: list[str]) -> None:
    """Async TP overlaps CUDA collectives: without CUDA, or with fewer GPUs than -tp, every
    run could only fail, so refuse before any starts. Runs asked for the CPU (`-- --device
    cpu`, gloo: as the tests run them) are let through."""
    if _engine_device(engine) == "cpu":
        return
    import torch
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        raise ValueError("async-tp: needs CUDA GPUs (async TP overlaps CUDA collectives); "
                         "torch sees none here (`-- --device cpu` runs it on the CPU instead)")
    if count < tp:
        raise ValueError(f"tensor_parallel_size: needs as many CUDA GPUs, torch sees {count}, "
                         f"got {tp}")


def _engine_device(engine: list[str]) -> str | None:
    """The --device among the engine flags, the last one given; None: none given."""
    device = None
    for i, arg in enumerate(engine):
        if arg == "--device" and i + 1 < len(engine):
            device = engine[i + 1]
        elif arg.startswith("--device="):
            device = arg.partition("=")[2]
    return device


def _run_one(args, engine: list[str], out_dir: Path, n: int, graph: str, v: Variant,
             repeat: int) -> dict[str, Any]:
    name = f"{graph}{n}-{v.name}-r{repeat}"
    json_path, log_path = out_dir / f"{name}.json", out_dir / f"{name}.log"
    cmd = [sys.executable, "-m", "loom.cli", "bench", "latency", "--model", args.model,
           "-tp", str(args.tensor_parallel_size), "--input-len", str(n), "--output-len", "1",
           "--batch-size", "1", "--num-iters-warmup", str(args.num_iters_warmup),
           "--num-iters", str(args.num_iters), "-O",
           json.dumps(v.compilation(n, graph, _base_config(args.compilation_config))),
           "--output-json", str(json_path), *engine]
    env = {**os.environ, "LOOM_ASYNC_TP_IMPL": v.impl}
    print(f"[{name}] {command_line(['loom', *cmd[3:]])}", flush=True)
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            return {"run": name, "error": f"timed out after {args.run_timeout:.0f} s"}
    if proc.returncode != 0 or not json_path.exists():
        tail = log_path.read_text().strip().splitlines()[-3:]
        return {"run": name, "error": f"exit {proc.returncode}: {' | '.join(tail)}"}
    result = json.loads(json_path.read_text())
    return {"run": name, "avg_latency_s": result["avg_latency"], "device": result["device"],
            "ceilings": result["ceilings"]}


def _row(n: int, graph: str, variants: list[Variant],
         runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    cells = {}
    for v in variants:
        values = [x["avg_latency_s"] for x in runs[v.name] if "avg_latency_s" in x]
        cells[v.name] = {"runs": runs[v.name], "latencies_s": values,
                         "mean_s": float(np.mean(values)) if values else None}
    off = cells["off"]["mean_s"]
    for v in variants:
        mean = cells[v.name]["mean_s"]
        cells[v.name]["ratio_to_off"] = mean / off if mean is not None and off else None
    device = next((x["device"] for c in runs.values() for x in c if "device" in x), None)
    return {"input_len": n, "graph": graph, "device": device, "cells": cells}


def _cell(cell: dict[str, Any]) -> str:
    if cell["mean_s"] is None:
        return "failed"
    runs = "/".join(f"{v * 1e3:.1f}" for v in cell["latencies_s"])
    ratio = cell["ratio_to_off"]
    return f"{cell['mean_s'] * 1e3:.1f} ms ({runs})" + (f" {ratio:.3f}x" if ratio else "")


def _print_row(row: dict[str, Any], variants: list[Variant]) -> None:
    print(f"{row['input_len']} tokens, {row['graph']}: " +
          "; ".join(f"{v.name} {_cell(row['cells'][v.name])}" for v in variants), flush=True)
    for v in variants:
        for run in row["cells"][v.name]["runs"]:
            if "error" in run:
                print(f"  {run['run']}: {run['error']}")


def print_table(rows: list[dict[str, Any]], variants: list[Variant]) -> None:
    """Mean latency per cell (each repeat in brackets), and its ratio to off."""
    width = 34
    head = f"{'input':>6} | {'graph':>7} | " + " | ".join(f"{v.name:>{width}}" for v in variants)
    print(head)
    print("-" * len(head))
    for row in rows:
        print(f"{row['input_len']:>6} | {row['graph']:>7} | " +
              " | ".join(f"{_cell(row['cells'][v.name]):>{width}}" for v in variants))
