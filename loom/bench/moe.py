"""`loom bench moe`: the Triton fused MoE (loom/kernels/fused_moe.py) per batch size, and
with `--tune` a search for its tile configs.

The model's expert shapes (hidden_size, moe_intermediate_size / TP, num_experts,
num_experts_per_tok) come from `--model`. For each batch size M (tokens) it draws fresh
inputs (hidden ~ 0.1 * randn, routing = top-k of a softmax over random logits, so experts
load about evenly) and times the whole call as the model runs it: moe_align, both kernels
and the sum over top-k, replayed from a CUDA graph with L2 flushed before each replay (the
model's other layers evict the experts' weights between two MoE calls). It prints M, the
config, the median time, the TFLOP/s achieved (6 * M * top_k * H * I flops: gate_up
2 * H * 2I and down 2 * I * H per slot) and the bandwidth over the weights of the experts the
routing touched (3 * H * I elements each).

Without --tune it times the config fused_moe itself would pick (the tuned file, else the
defaults). With --tune it compiles a pruned grid of configs on every CPU at once (Triton's
compile dominates the search), times each config per M, re-times the fastest few with
GROUP_M variants, checks the winner against moe_reference, and writes the winners into
`E=..,N=..,dtype=..,device_name=...json` in loom/kernels/configs/ (or --save-dir), keeping
the file's entries for other batch sizes; fused_moe looks it up (the key nearest to the
call's token count wins). A batch size where no config ran, or none agreed with the
reference, is reported with the errors that stopped it and left as it was; the sizes tuned
are still written, and the command exits 1. Where a batch leaves each expert two rows or
fewer, the grid also holds the GEMV kernels' configs (GEMV = 1, loom/kernels/moe_gemv.py).
`--weight-dtype fp8` (or fp8-block) times and tunes fp8 experts (W8A16) and their
`dtype=float8_e4m3fn` file;
`--weight-dtype int4` int4 experts (W4A16: random packed weights, a scale and a zero point
per group of 128, as AWQ / GPTQ releases hold them) and their `dtype=int4_w4a16` file
(its grid's grouped-GEMM tiles step K by at most the group's 128 columns); `--weight-dtype
int8` 8-bit integer experts alike (W8A16: GPTQ-Int8, compressed-tensors' W8A16; four values
a word) and their `dtype=int8_w8a16` file. The GB/s column counts the bytes a weight takes:
2 (bf16), 1 (fp8), or 0.5 (int4) or 1 (int8) plus its group's scale and zero point.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from loom.bench.common import command_line, git_commit, now_iso, write_json
from loom.bench.moe_space import group_variants, moe_shape
from loom.bench.moe_timing import MAX_REL_ERROR, Bench
from loom.kernels.compile_pool import compile_pool

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DTYPES = ("bfloat16", "float16")
WEIGHT_DTYPES = ("auto", "fp8", "fp8-block", "int4", "int8")
TOP_FOR_GROUPS = 3
"""How many of the fastest configs of a batch size get re-timed, with GROUP_M variants."""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "moe", help="time the fused MoE kernel per batch size; --tune searches its tile configs",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen3-30b-a3b",
                   help="a shipped config name (loom/bench/configs), a model directory or a "
                        "config.json (default qwen3-30b-a3b)")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1,
                   help="each rank holds moe_intermediate_size / TP of every expert")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(DEFAULT_BATCH_SIZES),
                   help="token counts M")
    p.add_argument("--tune", action="store_true",
                   help="search tile configs and write the fastest per M")
    p.add_argument("--save-dir", default=None,
                   help="where --tune writes its file (default: loom/kernels/configs)")
    p.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    p.add_argument("--weight-dtype", default="auto", choices=WEIGHT_DTYPES,
                   help="the experts' weights: auto (--dtype), fp8 (float8_e4m3fn with a "
                        "scale per output channel, as --quantization fp8 makes them) or "
                        "fp8-block (128x128 block scales, as Qwen3's FP8 releases); fp8 "
                        "tunes the float8_e4m3fn table, which both fp8 layouts read; int4 "
                        "(W4A16, random packed weights with a scale and zero point per "
                        "group of 128) tunes the int4_w4a16 table; int8 (W8A16, 8-bit "
                        "integers packed alike) the int8_w8a16 table")
    p.add_argument("--num-iters-warmup", type=int, default=3)
    p.add_argument("--num-iters", type=int, default=20,
                   help="timed replays per result (the search's first pass takes fewer at "
                        "large M)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", default=None)
    p.set_defaults(func=run_moe)


def _precompile(bench: Bench, configs: list[dict[str, int]]) -> float:
    """Compile every config's two kernels on all CPUs at once; seconds taken. Failures
    are left for the timed run to meet (and skip)."""
    from loom.kernels.fused_moe import compile_fused_moe
    start = time.perf_counter()
    with compile_pool(os.cpu_count() or 4, ignore_errors=True) as threads:
        if not threads:  # an older Triton: each compiles at its first launch instead
            return 0.0
        for config in configs:
            # A config that cannot even be set up fails again, visibly, when timed.
            with contextlib.suppress(Exception):
                compile_fused_moe(*bench.inputs, config, **bench.quant)
    return time.perf_counter() - start


def _skip_reason(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:160]


def tune_batch(bench: Bench, num_tokens: int, bar) -> dict[str, Any]:
    """The fastest checked config for one batch size, with its time; the bar advances once
    per first-pass config."""
    shape = bench.shape
    timed: list[tuple[float, dict[str, int]]] = []
    skipped: list[str] = []
    for config in bench.search_space(num_tokens):
        try:
            timed.append((bench.time_us(config, budget_s=0.03), config))
        except Exception as e:  # noqa: BLE001 - out of shared memory, a compile failure
            skipped.append(f"{_fmt(config)}: {_skip_reason(e)}")
        bar.update(1)
    if not timed:
        raise ValueError(f"moe: no config ran at M={num_tokens}: {skipped[:3]}")
    timed.sort(key=lambda t: t[0])
    finalists = [c for _, c in timed[:TOP_FOR_GROUPS]]
    finalists += [v for c in finalists for v in group_variants(shape, num_tokens, c)]
    _precompile(bench, finalists)
    final: list[tuple[float, dict[str, int]]] = []
    for config in finalists:
        try:
            final.append((bench.time_us(config), config))
        except Exception as e:  # noqa: BLE001
            skipped.append(f"{_fmt(config)}: {_skip_reason(e)}")
    if not final:  # e.g. a launch that faulted: CUDA refuses every launch after it
        raise ValueError(f"moe: no finalist ran at M={num_tokens}: {skipped[-3:]}")
    final.sort(key=lambda t: t[0])
    limit = MAX_REL_ERROR[str(bench.dtype).removeprefix("torch.")]
    rejected = []
    for us, config in final:
        err = bench.check(config)
        if err <= limit:
            return {"config": config, "us": us, "max_rel_error": err, "skipped": skipped,
                    "rejected": rejected, "searched": len(timed) + len(final)}
        rejected.append({"config": config, "max_rel_error": err})
    raise ValueError(f"moe: every finalist at M={num_tokens} disagrees with moe_reference "
                     f"(worst per-token relative error over {limit}): {rejected}")


def merged_table(path: Path, rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """The file's table with the tuned batch sizes' entries replaced or added and the
    others kept (tuning a few sizes leaves the rest of a file alone), sorted by size."""
    from loom.kernels import moe_config as mc
    table = json.loads(path.read_text()) if path.is_file() else {}
    for r in rows:
        table[str(r["batch_size"])] = {k: r["config"].get(k, 0) for k in mc.CONFIG_KEYS}
    return dict(sorted(table.items(), key=lambda item: int(item[0])))


def _fmt(config: dict[str, int]) -> str:
    return (f"BLOCK_M={config['BLOCK_M']} BLOCK_N={config['BLOCK_N']} "
            f"BLOCK_K={config['BLOCK_K']} GROUP_M={config['GROUP_M']} "
            f"{'GEMV ' if config.get('GEMV') else ''}{'TMA ' if config.get('TMA') else ''}"
            f"warps={config['num_warps']} stages={config['num_stages']}")


def _row(bench: Bench, num_tokens: int, config: dict[str, int], us: float,
         elem_size: float) -> dict[str, Any]:
    shape = bench.shape
    seconds = us * 1e-6
    weight_bytes = bench.experts_touched * shape.expert_bytes(elem_size)
    return {"batch_size": num_tokens, "config": config, "us": us,
            "tflops": shape.flops(num_tokens) / seconds / 1e12,
            "gbps": weight_bytes / seconds / 1e9, "experts_touched": bench.experts_touched}


def _line(row: dict[str, Any]) -> str:
    return (f"M={row['batch_size']:>6}  {_fmt(row['config'])}  {row['us']:>10.1f} us  "
            f"{row['tflops']:>7.1f} TFLOP/s  {row['gbps']:>7.0f} GB/s "
            f"({row['experts_touched']} experts)")


def _check_args(args: argparse.Namespace) -> list[int]:
    """The distinct batch sizes, once the arguments and the machine can run them."""
    sizes = list(dict.fromkeys(args.batch_sizes))
    if not sizes or min(sizes) < 1:
        raise ValueError(f"batch_sizes: must be positive, got {args.batch_sizes}")
    if args.num_iters < 1 or args.num_iters_warmup < 0:
        raise ValueError("num_iters must be positive and num_iters_warmup >= 0")
    import torch
    if not torch.cuda.is_available():
        raise ValueError("moe: needs a CUDA GPU (it times the Triton fused MoE kernels); "
                         "torch sees none here")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise ValueError("moe: TRITON_INTERPRET is set: the kernels would run on the CPU "
                         "interpreter; unset it")
    for module in ("triton", "tqdm"):
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"moe: {module} is not installed (pip install 'loom[triton]')")
    return sizes


def _tune_rows(bench: Bench, sizes: list[int],
               elem_size: float) -> tuple[list[dict[str, Any]], dict[int, str], float]:
    """Search each batch size's configs (all compiled first, on every CPU); returns the
    rows, why each size that found no config failed (the others are kept) and the seconds
    the compile took."""
    from tqdm import tqdm
    spaces = {m: bench.search_space(m) for m in sizes}
    union = list({tuple(sorted(c.items())): c for s in spaces.values() for c in s}.values())
    bench.set_batch(sizes[0])
    print(f"compiling {len(union)} configs on {os.cpu_count()} threads...", flush=True)
    compile_s = _precompile(bench, union)
    print(f"compiled in {compile_s:.1f} s", flush=True)
    rows, failed = [], {}
    with tqdm(total=sum(len(s) for s in spaces.values()), desc="tuning",
              unit="config", dynamic_ncols=True) as bar:
        for m in sizes:
            bar.set_postfix_str(f"M={m}")
            try:
                bench.set_batch(m)
                best = tune_batch(bench, m, bar)
            except ValueError as e:
                failed[m] = str(e)
                bar.write(f"M={m:>6}  not tuned: {e}")
                continue
            row = {**_row(bench, m, best["config"], best["us"], elem_size),
                   "max_rel_error": best["max_rel_error"], "searched": best["searched"],
                   "skipped": best["skipped"], "rejected": best["rejected"]}
            rows.append(row)
            bar.write(_line(row))
    return rows, failed, compile_s


def _picked_rows(bench: Bench, sizes: list[int], elem_size: float) -> list[dict[str, Any]]:
    """Time the config fused_moe itself picks at each batch size."""
    from loom.kernels import moe_config as mc
    from loom.kernels.moe_quant import table_dtype
    shape = bench.shape
    rows = []
    for m in sizes:
        bench.set_batch(m)
        config = mc.get_config(m, shape.top_k, shape.num_experts, shape.inter, bench.dtype,
                               bench.device, weight_dtype=table_dtype(bench.w13, bench.bits))
        row = _row(bench, m, config, bench.time_us(config), elem_size)
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def run_moe(args: argparse.Namespace) -> int:
    shape = moe_shape(args.model, args.tensor_parallel_size)
    sizes = _check_args(args)
    import torch
    from loom.kernels import moe_config as mc
    from loom.kernels.moe_quant import table_dtype

    dtype = getattr(torch, args.dtype)
    bench = Bench(shape, dtype, args.seed, args.num_iters_warmup, args.num_iters,
                  args.weight_dtype)
    elem_size = bench.bytes_per_weight
    file_name = mc.config_file_name(shape.num_experts, shape.inter,
                                    table_dtype(bench.w13, bench.bits),
                                    mc.device_name(bench.device))
    device = torch.cuda.get_device_name(bench.device)
    print(f"{device}: E={shape.num_experts} top_k={shape.top_k} H={shape.hidden} "
          f"N={shape.inter} (TP {args.tensor_parallel_size}) {args.dtype}, weights "
          f"{args.weight_dtype}", flush=True)
    started = time.perf_counter()
    if args.tune:
        rows, failed, compile_s = _tune_rows(bench, sizes, elem_size)
        save_dir = Path(args.save_dir) if args.save_dir else mc.config_dir()
        config_file = None
        if rows:  # the sizes tuned are kept whatever happened to the others
            config_file = write_json(save_dir / file_name,
                                     merged_table(save_dir / file_name, rows))
            mc.load_config_file.cache_clear()
            print(f"Wrote {config_file}")
    else:
        failed = {}
        path = mc.config_dir() / file_name
        config_file = path if mc.load_config_file(str(path)) is not None else None
        print(f"configs: {config_file or 'defaults (no tuned file ' + str(path) + ')'}")
        rows, compile_s = _picked_rows(bench, sizes, elem_size), None
    elapsed = time.perf_counter() - started
    print(f"{len(rows)} batch sizes in {elapsed:.0f} s")
    from loom.bench.ceilings import measure_ceilings
    ceilings = measure_ceilings(bench.device)  # the rows' TFLOP/s and GB/s are judged by it
    print(f"ceilings: copy {ceilings.copy_tb_per_s:.2f} TB/s (read+write), bf16 matmul "
          f"{ceilings.matmul_tflop_per_s:.0f} TFLOP/s")
    if args.output_json:
        payload = {"benchmark": "moe", "date": now_iso(), "git_commit": git_commit(),
                   "ceilings": dataclasses.asdict(ceilings),
                   "command": command_line(), "device": device,
                   "model": args.model, "tensor_parallel_size": args.tensor_parallel_size,
                   "dtype": args.dtype, "weight_dtype": args.weight_dtype,
                   "hidden_size": shape.hidden,
                   "intermediate_size_per_shard": shape.inter, "num_experts": shape.num_experts,
                   "top_k": shape.top_k, "tuned": args.tune,
                   "config_file": str(config_file) if config_file else None,
                   "elapsed_s": elapsed, "precompile_s": compile_s, "rows": rows,
                   "not_tuned": {str(m): why for m, why in failed.items()}}
        print(f"Wrote {write_json(args.output_json, payload)}")
    if failed:
        print(f"loom bench moe: no config found at M = {', '.join(map(str, failed))} (each "
              f"reason above); those sizes keep their former entries", file=sys.stderr)
        return 1
    return 0
