"""`loom bench latency`: end-to-end latency of one batch, as vLLM's benchmark_latency.

Each iteration generates `--output-len` tokens for `--batch-size` prompts of `--input-len`
random token ids (ignore_eos, so every request runs to its length). Every iteration draws
fresh prompts, so prefix caching cannot turn later iterations into cache hits.

Beside the seed's `Avg latency` / percentile lines it prints the ceilings measured in the
same run and the ratios to them (see `loom.bench.floors` for the conventions):
- `--output-len 1`: prefill latency against the compute floor.
- otherwise: decode ms/token against the weight-read floor. With `--decode-split` a second
  series runs with `--output-len 1` and ms/token = (avg(L_out) - avg(L_1)) / (out - 1), which
  takes the prefill out; without it, ms/token = avg latency / output_len (prefill included).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from tqdm import tqdm

from loom.bench import floors
from loom.bench.common import percentiles, write_json
from loom.bench.step_log import StepLog, decode_step_times
from loom.bench.offline import (
    OfflineBench,
    add_offline_args,
    check_positive,
    held_ratio,
    print_ceilings,
    setup_offline,
)
from loom.config import CompilationConfig
from loom.sampling_params import SamplingParams
from loom.speculative_config import SpeculativeConfig

PERCENTILES = (10, 25, 50, 75, 90, 99)


def register(subparsers) -> None:
    p = subparsers.add_parser("latency", help="latency of one batch of requests, end to end")
    p.add_argument("--input-len", "--input_len", type=int, default=32)
    p.add_argument("--output-len", "--output_len", type=int, default=128)
    p.add_argument("--batch-size", "--batch_size", type=int, default=8)
    p.add_argument("--num-iters-warmup", "--num_iters_warmup", type=int, default=10)
    p.add_argument("--num-iters", "--num_iters", type=int, default=30)
    p.add_argument("--reference-json", default=None,
                   help="a 1-GPU latency JSON at the same input length: with -tp N and "
                        "--output-len 1, also print the target 1-GPU/N + all-reduce time")
    p.add_argument("--decode-split", action="store_true",
                   help="also time --output-len 1 and report decode ms/token without the prefill")
    p.add_argument("--profile", action="store_true",
                   help="run one more iteration under torch.profiler on every rank: print the "
                        "ops by device time, write Chrome traces to --profile-result-dir")
    p.add_argument("--profile-host", action="store_true",
                   help="run one more iteration under Python's cProfile on every rank: write "
                        "each rank's functions by host time to --profile-result-dir")
    p.add_argument("--profile-result-dir", default="loom-profile")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="the requests' temperature (vLLM's benchmark samples at 1.0, top_p 1.0; "
                        "0 decodes greedily)")
    add_offline_args(p)
    p.set_defaults(func=run_latency)


@dataclass
class Series:
    output_len: int
    latencies: list[float]

    @property
    def avg(self) -> float:
        return float(np.mean(self.latencies))

    def summary(self) -> dict[str, Any]:
        return {"output_len": self.output_len, "latencies": self.latencies, "avg_latency": self.avg,
                "percentiles": percentiles(self.latencies, PERCENTILES)}


def run_latency(args: argparse.Namespace) -> int:
    check_positive(input_len=args.input_len, output_len=args.output_len,
                   batch_size=args.batch_size, num_iters=args.num_iters)
    if args.num_iters_warmup < 0:
        raise ValueError(f"num_iters_warmup: must be non-negative, got {args.num_iters_warmup}")
    if args.decode_split and args.output_len < 2:
        raise ValueError("decode_split: needs --output-len of at least 2")
    args.compilation_config = only_the_replayed_graph(args)
    bench = setup_offline(args)
    try:
        return _run(bench, args)
    finally:  # the workers go now, not whenever the LLM is collected (a caller may go on)
        bench.llm.shutdown()


def _run(bench: OfflineBench, args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    spec = bench.llm.engine.scheduler.spec
    before = spec.totals() if spec is not None else None
    log = StepLog() if spec is not None else None
    main = measure(bench, args, args.output_len, rng, log)
    print_series(main)
    drafts = spec_summary(before, spec.totals(), log) if spec is not None else None
    prefill = measure(bench, args, 1, rng) if args.decode_split else None
    print_ceilings(bench.ceilings)
    ratios = latency_floors(bench, args, main, prefill)
    ratios.update(tp_all_reduce_target(bench, args, main))
    print_floors(ratios)
    if args.profile:
        profile_iteration(bench, args, rng)
    if args.profile_host:
        profile_iteration(bench, args, rng, host=True)
    if args.output_json:
        payload = {**bench.provenance("latency"), **_params(args), **main.summary(),
                   "decode_split": prefill.summary() if prefill else None, "floors": ratios,
                   "speculative": drafts}
        print(f"Wrote {write_json(args.output_json, payload)}")
    return 0


def spec_summary(before: tuple[int, int, int], after: tuple[int, int, int],
                 log: StepLog | None = None) -> dict:
    """Speculative decoding over the main series (warm-up included): verified steps,
    drafted and accepted tokens, and the mean tokens a verified step produced; with the
    timed iterations' step log, the wall time of a verify step and of a plain decode
    (`step_log.decode_step_times`), each step by itself: latency / verified steps would
    count the plain decodes before the first draft as verify steps."""
    steps, drafted, accepted = (a - b for a, b in zip(after, before))
    mean = 1 + accepted / steps if steps else None
    print(f"Speculative decoding: {steps} verified steps, {accepted} of {drafted} draft tokens "
          f"accepted; mean acceptance length {mean if mean is None else round(mean, 3)}")
    times = decode_step_times(log.steps) if log is not None else {}
    if times:
        print("  a step, median (p10-p90; timed iterations): " + "; ".join(
            f"{kind} {t['median_ms']:.3f} ms ({t['p10_ms']:.3f}-{t['p90_ms']:.3f}, "
            f"{t['steps']} steps)" for kind, t in times.items()))
    return {"verified_steps": steps, "draft_tokens": drafted, "accepted_tokens": accepted,
            "mean_acceptance_length": mean, "step_ms": times}


def only_the_replayed_graph(args: argparse.Namespace) -> CompilationConfig | str | int | None:
    """Unless -O lists cudagraph_capture_sizes, capture only the decode batch this run
    replays (none with --output-len 1). The figures come from that same graph either way;
    start-up skips ~25 s of captures never replayed (Qwen3-30B-A3B did not start within
    150 s with all 35)."""
    from loom.worker.worker import resolve_device
    config = CompilationConfig.parse(args.compilation_config)
    level = config.resolved(resolve_device(args.device).type).level
    if config.cudagraph_capture_sizes is not None or level == 0 or args.enforce_eager \
            or config.cudagraph_mode == "PIECEWISE":  # there the sizes are its pieces'
        return args.compilation_config
    sizes = (args.batch_size,) if args.output_len > 1 else ()
    spec = SpeculativeConfig.parse(args.speculative_config)
    if spec is not None and sizes and config.cudagraph_mode == "FULL":
        # its verify steps, k + 1 tokens a request (FULL_AND_PIECEWISE sizes their graphs
        # from the decode batch's)
        sizes = (args.batch_size, args.batch_size * (spec.num_speculative_tokens + 1))
    prompt = args.batch_size * args.input_len
    if config.cudagraph_mode == "FULL" and prompt <= FULL_PROMPT_MAX:
        # FULL's mixed graphs go up to the largest decode size: let it hold the prompt step
        sizes = tuple(sorted({*sizes, prompt}))
        decode = f"batch size {sizes[0]} and " if prompt > sizes[0] else ""
        print(f"CUDA graphs: capturing {decode}the prompt step's {prompt} tokens "
              "(cudagraph_mode FULL) only")
    else:
        print(f"CUDA graphs: capturing batch sizes {', '.join(map(str, sizes))} only" if sizes else
              "CUDA graphs: none captured (--output-len 1 has no decode step)")
    return replace(config, cudagraph_capture_sizes=sizes)


FULL_PROMPT_MAX = 512
"""The largest prompt step `bench latency` captures a FULL graph for (the default decode
sizes stop at 512 too)."""


def measure(bench: OfflineBench, args: argparse.Namespace, output_len: int,
            rng: np.random.Generator, log: StepLog | None = None) -> Series:
    """The series' latencies; `log`, if given, is told of every step of the timed iterations
    (not the warm-up's)."""
    params = SamplingParams(max_tokens=output_len, ignore_eos=True,
                            temperature=args.temperature, top_p=1.0)

    def once() -> float:
        prompts = bench.random_prompts(rng, args.batch_size, args.input_len)
        start = time.perf_counter()
        outputs = bench.llm.generate(prompts, params, use_tqdm=False,
                                     lora_request=bench.lora_requests(len(prompts)))
        elapsed = time.perf_counter() - start
        _check_lengths(outputs, output_len)
        return elapsed

    tag = f"output_len={output_len}"
    for _ in tqdm(range(args.num_iters_warmup), desc=f"Warmup ({tag})"):
        once()
    if log is not None:
        bench.llm.engine.step_observer = log
        log.start()
    try:
        latencies = [once() for _ in tqdm(range(args.num_iters),
                                          desc=f"Profiling iterations ({tag})")]
    finally:
        if log is not None:
            log.stop()
            bench.llm.engine.step_observer = None
    return Series(output_len, latencies)


def profile_iteration(bench: OfflineBench, args: argparse.Namespace,
                      rng: np.random.Generator, host: bool = False) -> None:
    """One more iteration of the main series under torch.profiler (or, with `host`, Python's
    cProfile) on every rank."""
    engine = bench.llm.engine
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True,
                            temperature=args.temperature, top_p=1.0)
    prompts = bench.random_prompts(rng, args.batch_size, args.input_len)
    suffix = "-host" if host else ""
    engine.collective_rpc("profile", "start" + suffix)
    try:
        bench.llm.generate(prompts, params, use_tqdm=False,
                           lora_request=bench.lora_requests(len(prompts)))
    finally:
        tables = engine.collective_rpc("profile", "stop" + suffix, args.profile_result_dir)
    what = "host functions" if host else "trace and table"
    print(f"Profile of one iteration (rank 0; every rank's {what} in "
          f"{args.profile_result_dir}/):")
    print(tables[0] if not host else "\n".join(tables[0].splitlines()[:60]))


def _check_lengths(outputs, output_len: int) -> None:
    for out in outputs:
        got = len(out.outputs[0].token_ids)
        if got != output_len:
            raise RuntimeError(f"latency: a request produced {got} tokens, expected {output_len} "
                               "(ignore_eos was set)")


def print_series(series: Series) -> None:
    print(f"Avg latency: {series.avg} seconds")
    for point, value in percentiles(series.latencies, PERCENTILES).items():
        print(f"{point}% percentile latency: {value} seconds")


def latency_floors(bench: OfflineBench, args: argparse.Namespace, main: Series,
                   prefill: Series | None) -> dict[str, Any]:
    """Floors and measured/floor ratios; the floors are None without ceilings (CPU)."""
    counts = floors.param_counts(bench.arch)
    out: dict[str, Any] = {
        "tensor_parallel_size": bench.tp, "dtype_bytes": bench.dtype_bytes,
        "num_params": counts.active, "total_params": counts.total,
        "fp8": bench.fp8, "int4_bytes_per_weight": bench.int4_bytes,
        "expert_bytes_per_weight": bench.expert_bytes,
        "decode_weight_bytes": floors.decode_bytes(bench.arch, bench.dtype_bytes, args.batch_size,
                                                   bench.linear_bytes, bench.expert_bytes),
        "prefill_flops": floors.prefill_flops(bench.arch, args.input_len, args.batch_size)}
    prefill_s = main.avg if main.output_len == 1 else (prefill.avg if prefill else None)
    out.update(_prefill_ratio(bench, args, prefill_s))
    if main.output_len > 1:
        out.update(_decode_ratio(bench, args, main, prefill))
    return out


def _prefill_ratio(bench: OfflineBench, args: argparse.Namespace,
                   measured_s: float | None) -> dict[str, Any]:
    floor = None
    if bench.ceilings is not None:
        floor = floors.prefill_floor_s(bench.arch, args.input_len, args.batch_size,
                                       bench.matmul_tflops, bench.tp)
    fraction = floor / measured_s if floor is not None and measured_s else None
    ratio = held_ratio(bench.ceilings)
    return {"prefill_floor_s": floor, "prefill_latency_s": measured_s,
            "prefill_fraction_of_ceiling": fraction,
            "prefill_fraction_of_held_ceiling": fraction / ratio if fraction and ratio else None}


def _decode_ratio(bench: OfflineBench, args: argparse.Namespace, main: Series,
                  prefill: Series | None) -> dict[str, Any]:
    if prefill is not None:
        ms = (main.avg - prefill.avg) / (main.output_len - 1) * 1e3
        method = "split: (avg(output_len) - avg(1)) / (output_len - 1)"
    else:
        ms = main.avg / main.output_len * 1e3
        method = "whole request: avg / output_len, prefill included"
    floor_ms = None
    if bench.ceilings is not None:
        floor_ms = 1e3 * floors.decode_floor_s(bench.arch, bench.dtype_bytes, args.batch_size,
                                               bench.ceilings.copy_tb_per_s, bench.tp,
                                               bench.linear_bytes, bench.expert_bytes)
    return {"decode_ms_per_token": ms, "decode_ms_per_token_method": method,
            "decode_floor_ms_per_token": floor_ms,
            "decode_ratio_to_floor": ms / floor_ms if floor_ms else None}


def tp_all_reduce_target(bench: OfflineBench, args: argparse.Namespace,
                         main: Series) -> dict[str, Any]:
    """The all-reduce time of one forward, measured on the engine's own ranks. For a TP
    prefill, also the target (1-GPU latency / N) + that time when a 1-GPU result is given;
    for decode, the all-reduces of one step replayed from a CUDA graph (on GPU)."""
    if bench.tp == 1:
        return {}
    count = 2 * bench.arch.num_layers + 1  # embedding, then attention and MLP per layer
    if main.output_len != 1:
        # A decode step all-reduces [batch, hidden] `count` times inside its CUDA graph.
        try:
            per_call = bench.llm.engine.collective_rpc(
                "time_all_reduce", args.batch_size, count, True)[0]
        except Exception as e:  # noqa: BLE001 - a diagnostic must not cost the run's result
            print(f"All-reduce timing skipped: {type(e).__name__}: {e}")
            return {}
        return {"decode_all_reduce_s": per_call, "all_reduces_per_forward": count,
                "decode_all_reduce_step_s": per_call * count}
    tokens = args.input_len * args.batch_size
    per_call = bench.llm.engine.collective_rpc("time_all_reduce", tokens, 10)[0]
    out: dict[str, Any] = {"all_reduce_s": per_call, "all_reduces_per_forward": count,
                           "all_reduce_forward_s": per_call * count}
    if args.reference_json:
        with open(args.reference_json) as f:
            reference = json.load(f)["avg_latency"]
        target = reference / bench.tp + per_call * count
        out.update(reference_latency_s=reference, tp_target_s=target,
                   tp_ratio_to_target=main.avg / target)
    return out


def print_floors(r: dict[str, Any]) -> None:
    if "decode_all_reduce_s" in r:
        print(f"All-reduce (decode step, in a CUDA graph on GPU): {r['all_reduces_per_forward']}"
              f" x {r['decode_all_reduce_s'] * 1e6:.1f} us = "
              f"{r['decode_all_reduce_step_s'] * 1e3:.3f} ms per step")
    if "all_reduce_s" in r:
        line = (f"All-reduce: {r['all_reduces_per_forward']} x {r['all_reduce_s'] * 1e6:.1f} us "
                f"= {r['all_reduce_forward_s'] * 1e3:.2f} ms per forward")
        if "tp_target_s" in r:
            line += (f"; target 1-GPU {r['reference_latency_s']:.4f} s / "
                     f"{r['tensor_parallel_size']} + all-reduce = {r['tp_target_s']:.4f} s -> "
                     f"{r['tp_ratio_to_target']:.2f}x the target")
        print(line)
    if r["prefill_latency_s"] is not None and r["prefill_floor_s"] is not None:
        print(f"Prefill: {r['prefill_latency_s']:.4f} s, floor {r['prefill_floor_s']:.4f} s "
              f"({r['prefill_flops'] / 1e12:.2f} TFLOP, tp={r['tensor_parallel_size']}) -> "
              f"{100 * r['prefill_fraction_of_ceiling']:.1f}% of the matmul ceiling"
              + (f" ({100 * r['prefill_fraction_of_held_ceiling']:.1f}% of its held rate)"
                 if r.get("prefill_fraction_of_held_ceiling") else ""))
    if "decode_ms_per_token" not in r:
        return
    line = f"Decode: {r['decode_ms_per_token']:.3f} ms/token ({r['decode_ms_per_token_method']})"
    if r["decode_floor_ms_per_token"] is not None:
        line += (f", floor {r['decode_floor_ms_per_token']:.3f} ms/token "
                 f"({r['decode_weight_bytes'] / 1e9:.2f} GB of weights) -> "
                 f"{r['decode_ratio_to_floor']:.2f}x the floor")
    print(line)


def _params(args: argparse.Namespace) -> dict[str, Any]:
    return {"input_len": args.input_len, "output_len": args.output_len,
            "batch_size": args.batch_size, "num_iters_warmup": args.num_iters_warmup,
            "num_iters": args.num_iters}

