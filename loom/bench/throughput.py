"""`loom bench throughput`: offline throughput, as vLLM's benchmark_throughput.

All `--num-prompts` prompts go to `LLM.generate` at once (ignore_eos); the wall time of that
call is the runtime. `--dataset-name random` (the default): `--input-len` random token ids
each, `--output-len` tokens out, both spread by `--random-range-ratio`; `sharegpt`: the
first human turn of `--dataset-path`'s conversations as text, the reply's length out (or
`--output-len`), filtered as vLLM's benchmark filters them. On CUDA the runtime is compared
with the compute floor: every token (prompt and output) x 2 x num_params at the measured
matmul rate, divided by tp (`loom.bench.floors`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from loom.bench import floors
from loom.bench.common import write_json
from loom.bench.datasets import DatasetConfig, draw_lengths, sample_requests
from loom.bench.step_log import (StepLog, breakdown, device_clock, gc_report,
                                  print_breakdown, print_gc, step_table)
from loom.bench.offline import (
    OfflineBench,
    add_offline_args,
    check_positive,
    held_ratio,
    print_ceilings,
    setup_offline,
)
from loom.sampling_params import SamplingParams


def register(subparsers) -> None:
    p = subparsers.add_parser("throughput", help="offline throughput of many requests at once")
    p.add_argument("--input-len", "--input_len", type=int, default=1024)
    p.add_argument("--output-len", "--output_len", type=int, default=None,
                   help="tokens out of each request (default 128; sharegpt: each reply's)")
    p.add_argument("--num-prompts", "--num_prompts", type=int, default=1000)
    p.add_argument("--dataset-name", "--dataset_name", default="random",
                   choices=("random", "sharegpt"))
    p.add_argument("--dataset-path", "--dataset_path", default=None,
                   help="the ShareGPT JSON, for --dataset-name sharegpt")
    p.add_argument("--n", type=int, default=1,
                   help="completions sampled from each prompt (SamplingParams.n)")
    p.add_argument("--random-range-ratio", "--random_range_ratio", type=float, default=0.0,
                   help="random lengths drawn from len * (1 - ratio) .. len * (1 + ratio)")
    p.add_argument("--step-breakdown", action="store_true",
                   help="time every engine step (by CUDA events where the worker runs in "
                        "this process on a GPU, else between read-backs) and report "
                        "prompt-carrying and pure decode steps apart, each against its own "
                        "floor")
    p.add_argument("--profile-steps", type=int, nargs=2, metavar=("START", "COUNT"),
                   help="run engine steps START .. START+COUNT-1 (1-based, in launch order) "
                        "under torch.profiler on every rank: print rank 0's ops by device "
                        "time, write Chrome traces and tables to --profile-result-dir")
    p.add_argument("--profile-result-dir", default="loom-profile")
    add_offline_args(p)
    p.set_defaults(func=run_throughput)


def run_throughput(args: argparse.Namespace) -> int:
    if args.dataset_name == "random" and args.output_len is None:
        args.output_len = DEFAULT_OUTPUT_LEN
    lengths = {"input_len": args.input_len, "output_len": args.output_len}
    if args.output_len is None:  # sharegpt without --output-len: each reply's own length
        del lengths["output_len"]
    check_positive(**lengths, num_prompts=args.num_prompts, n=args.n)
    if not 0 <= args.random_range_ratio < 1:
        raise ValueError(f"random_range_ratio: must be in [0, 1), got {args.random_range_ratio}")
    if args.dataset_name == "sharegpt" and not args.dataset_path:
        raise ValueError("dataset_path: --dataset-name sharegpt reads a ShareGPT JSON; pass "
                         "--dataset-path")
    if args.profile_steps is not None:
        start, count = args.profile_steps
        check_positive(profile_steps=min(start, count))
    bench = setup_offline(args)
    try:
        return _run(bench, args)
    finally:  # the workers go now, not whenever the LLM is collected (a caller may go on)
        bench.llm.shutdown()


def _run(bench: OfflineBench, args: argparse.Namespace) -> int:
    engine = bench.llm.engine
    if args.profile_steps is not None:
        engine.collective_rpc("profile_steps", *args.profile_steps, args.profile_result_dir)
    prompts, lengths = _requests(bench, args, np.random.default_rng(args.seed))
    params = [SamplingParams(n=args.n, max_tokens=k, ignore_eos=True, temperature=1.0,
                             top_p=1.0) for k in lengths]
    log = None
    if args.step_breakdown:
        log = engine.step_observer = StepLog(device_clock(engine.executor))
        log.start()
    allocator = engine.collective_rpc("allocator_stats")[0]
    start = time.perf_counter()
    outputs = bench.llm.generate(prompts, params, use_tqdm=True,
                                 lora_request=bench.lora_requests(len(prompts)))
    elapsed = time.perf_counter() - start
    if allocator is not None:
        allocator = allocator_delta(allocator, engine.collective_rpc("allocator_stats")[0])
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    output_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    result = throughput_figures(bench, len(outputs), prompt_tokens, output_tokens, elapsed)
    print_throughput(result)
    if args.profile_steps is not None:
        result["profiled_steps"] = print_step_profile(
            engine.collective_rpc("profile_steps_result")[0], args)
    print_ceilings(bench.ceilings)
    result["cuda_allocator"] = allocator
    if allocator is not None:
        print_allocator(allocator)
    if log is not None:
        log.stop()
        engine.step_observer = None
        result["step_breakdown"] = breakdown(log, bench.arch, bench.dtype_bytes, bench.tp,
                                             bench.ceilings, bench.kv_dtype_bytes)
        print_breakdown(result["step_breakdown"], elapsed, log.clock_name)
        result["step_clock"] = log.clock_name
        result["steps"] = step_table(log)
        result["first_step_launched_s"] = log.first_launch_s
        print(f"  the first step launched {log.first_launch_s:.3f} s into the run (taking in "
              f"the {len(prompts)} requests: in no step's time)")
        result["gc"] = gc_report(log)
        print_gc(result["gc"])
        computed = sum(row["prompt_tokens"] for row in result["step_breakdown"].values())
        result["prompt_tokens_computed"] = computed
        print(f"Prompt tokens computed: {computed} for {prompt_tokens} in the prompts "
              f"({computed / prompt_tokens - 1:+.1%}: recomputed after preemptions, or saved "
              f"by prefix-cache hits)")
    if result["floor_s"] is not None:
        print(f"Compute floor: {result['floor_s']:.3f} s ({result['total_tokens']} tokens x 2 x "
              f"{result['num_params'] / 1e9:.3f}B params, tp={bench.tp}); runtime "
              f"{elapsed:.3f} s -> {result['runtime_ratio_to_floor']:.2f}x the floor")
    if result.get("floor_held_s") is not None:
        print(f"Compute floor at the held matmul rate: {result['floor_held_s']:.3f} s -> "
              f"{result['runtime_ratio_to_held_floor']:.2f}x")
    if args.output_json:
        payload = {**bench.provenance("throughput"), "dataset_name": args.dataset_name,
                   "dataset_path": args.dataset_path, "input_len": args.input_len,
                   "output_len": args.output_len, "random_range_ratio": args.random_range_ratio,
                   "num_prompts": args.num_prompts, "n": args.n, **result}
        print(f"Wrote {write_json(args.output_json, payload)}")
    return 0


DEFAULT_OUTPUT_LEN = 128


def _requests(bench: OfflineBench, args: argparse.Namespace, rng: np.random.Generator
              ) -> tuple[list, list[int]]:
    """The prompts (token ids, or ShareGPT texts) and each one's output length."""
    if args.dataset_name == "random":
        ratio, n = args.random_range_ratio, args.num_prompts
        ins = draw_lengths(rng, args.input_len, ratio, n)
        outs = draw_lengths(rng, args.output_len, ratio, n)
        return [bench.random_prompts(rng, 1, k)[0] for k in ins], outs
    tokenizer = bench.llm.tokenizer
    if tokenizer is None:
        raise ValueError("dataset_name: sharegpt prompts are text, and the model has no "
                         "tokenizer; pass --tokenizer")
    samples = sample_requests(DatasetConfig(
        "sharegpt", args.dataset_path, args.num_prompts, args.seed,
        sharegpt_output_len=args.output_len), tokenizer)
    frame = sum(map(len, tokenizer.special_frame))
    limit = bench.llm.processor.max_model_len
    long = [s for s in samples if s.prompt_len + frame + s.expected_output_len > limit]
    if long:
        raise ValueError(f"max_model_len: {len(long)} of the {len(samples)} ShareGPT requests "
                         f"need more than {limit} tokens (prompt and output); raise "
                         "--max-model-len (vLLM's filter keeps up to 2048)")
    return [s.prompt for s in samples], [s.expected_output_len for s in samples]


def throughput_figures(bench: OfflineBench, num_requests: int, prompt_tokens: int,
                       output_tokens: int, elapsed: float) -> dict[str, Any]:
    total = prompt_tokens + output_tokens
    floor = None
    if bench.ceilings is not None:
        floor = floors.throughput_floor_s(bench.arch, total, bench.matmul_tflops,
                                          bench.tp)
    ratio = held_ratio(bench.ceilings)
    held = floor / ratio if floor is not None and ratio else None
    return {"elapsed_time": elapsed, "num_requests": num_requests,
            "prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "total_tokens": total,
            "requests_per_second": num_requests / elapsed,
            "tokens_per_second": total / elapsed, "output_tokens_per_second": output_tokens / elapsed,
            "num_params": bench.arch.num_params, "tensor_parallel_size": bench.tp,
            "floor_s": floor, "runtime_ratio_to_floor": elapsed / floor if floor else None,
            "floor_held_s": held, "runtime_ratio_to_held_floor": elapsed / held if held else None}


def allocator_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What rank 0's CUDA allocator did during the run (`Worker.allocator_stats`): counts
    as differences, the bytes held as at the end."""
    held = "reserved_bytes.all.current"
    return {key: after[key] - (0 if key == held else before[key]) for key in after}


def print_allocator(d: dict[str, int]) -> None:
    print(f"CUDA allocator during the run (rank 0): {d['num_device_alloc']} device allocations, "
          f"{d['num_device_free']} frees, {d['num_alloc_retries']} retries after freeing its "
          f"cache, {d['num_ooms']} out of memory; "
          f"{d['reserved_bytes.all.current'] / 2**30:.2f} GiB held at the end")


def print_throughput(r: dict[str, Any]) -> None:
    print(f"Throughput: {r['requests_per_second']:.2f} requests/s, "
          f"{r['tokens_per_second']:.2f} total tokens/s, "
          f"{r['output_tokens_per_second']:.2f} output tokens/s")


def print_step_profile(profile: dict, args: argparse.Namespace) -> list[dict]:
    """Rank 0's table of the profiled steps, headed by what they held; their contents."""
    start, count = args.profile_steps
    steps = json.loads(Path(profile["steps_file"]).read_text())
    if not steps:
        print(f"Profile: the run had fewer than {start} steps; nothing was profiled")
        return steps
    prompt = sum(s["prompt_tokens"] for s in steps)
    decodes = sum(s["decodes"] for s in steps)
    print(f"Profile of steps {start}-{start + len(steps) - 1} ({prompt} prompt tokens, "
          f"{decodes} decodes; rank 0, every rank's trace and table in "
          f"{args.profile_result_dir}/):")
    print(profile["table"])
    return steps
