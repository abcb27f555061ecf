"""`loom bench attention`: the Triton paged-attention kernels (loom/kernels/paged_attention.py
and paged_decode.py) at serving shapes, against the floor of reading every request's KV
cache, and with `--tune` a search for the split-K decode kernel's tiles.

The model's attention shape on one rank (num_attention_heads / TP, num_key_value_heads / TP,
head_dim) comes from `--model`. Each shape is one layer's attention in one step:

- `--mode decode`: B requests (--batch-sizes) of one query token each, every one with
  context_len tokens in the cache (--context-lens), timed through the attention backend's
  own call (TritonBackend.forward: its block_n and default_num_splits, the split-K kernel,
  which merges its splits itself).
- `--mode prefill`: --prompt-tokens of prompt chunks alone (no decodes), --chunk-len tokens
  each after --chunk-context cached tokens (one shape per --chunk-context value): the varlen
  kernel at throughput's prompt steps (whole 1024-token prompts, more of them than go to
  SDPA).
- `--mode mixed`: the same decodes plus --prompt-tokens of prompt chunks of --chunk-len
  tokens (each after --chunk-context cached tokens) in one step. It times the backend's
  split path (decodes through paged_decode and the chunks through paged_prefill, each over a
  device list of its request indices) and, beside it, the one paged_prefill launch over the
  whole batch (`single_launch` in the JSON), which the backend takes below
  LOOM_MIXED_SPLIT_MIN_DECODES decodes where no decode reads LOOM_MIXED_SPLIT_MIN_CONTEXT
  tokens (`split_by_default` says which it takes).
- `--mode verify`: B requests of --query-len tokens each (a speculative step's 1 + k) after
  context_len cached tokens: the backend's path (the split-K decode kernel at q_tokens,
  `mixed_split.short_query_tokens`) and, beside it, the one paged_prefill launch it took
  before (`single_launch`; `LOOM_SHORT_QUERY_DECODE=0`).

Every shape gets fresh inputs: a random cache of exactly the blocks the requests need, handed
out in a shuffled order (a real cache's blocks are not contiguous), and random queries. Each
variant's output is first compared against a float32 torch reference (keys and values
gathered through the block table, softmax attention); a worst per-(token, head) relative
error over the dtype's tolerance is an error, never a timing. Times are the median of
--num-iters replays of a CUDA graph of the call (plain launches where capture fails), each
after 256 MB written to flush L2 (the layers between two attention calls evict the cache).

The floor: bytes read / the copy rate, measured in the same run (loom/bench/ceilings.py; the
copy rate counts read + write bytes, so a kernel that only reads could in principle beat it).
Bytes read = every request's keys and values (seq_len x 2 x kv_heads x head_dim x dtype size)
+ the queries + the outputs; the block table and the decode partials are left out. Mixed
steps add the prompt chunks' causal attention FLOPs (4 x heads x head_dim per visible
(query, key) pair) at the bf16 matmul rate, as if the two did not overlap.

With `--tune` each shape also sweeps the kernel's tiles: in decode mode paged_decode's
block_n, num_warps, num_stages and num_splits (the default_num_splits choice for that
block_n, and of a few other values those that leave no split empty); in prefill mode
paged_prefill's block_m, block_n, num_warps and num_stages. It skips configs that fail to compile or
launch, checks the fastest against the reference and reports it with its speedup over the
backend's current choice. It writes no file: the winners are for changing the backend's
defaults by hand.

Without CUDA, tiny shapes run in Triton's CPU interpreter (TRITON_INTERPRET=1, set before
starting; float32 by default, as the interpreter mishandles bf16), timed with perf_counter
and with no ceilings: this is for testing the benchmark, not the kernels' speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import logging
import time
from typing import Any

from loom.bench.attention_variants import (
    TUNE_BLOCK_N, TUNE_PREFILL_BLOCK_M, TUNE_PREFILL_BLOCK_N, TUNE_PREFILL_STAGES,
    TUNE_PREFILL_WARPS, TUNE_SPLITS, TUNE_STAGES, TUNE_WARPS, backend_call, checked,
    recorded_launches, single_launch_call, tune)
from loom.bench.attention_workload import (AttentionShape, Step, attention_shape, decode_step,
                                           make_inputs, mixed_step, reference, step_bytes,
                                           step_flops, verify_step)
from loom.bench.common import command_line, git_commit, now_iso, write_json
from loom.bench.kernel_timing import KernelTimer
from loom.config import KV_CACHE_DTYPES

logger = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = (1, 8, 64, 256, 512, 1024)
DEFAULT_CONTEXT_LENS = (1024, 1280, 4096)
DTYPES = ("bfloat16", "float16", "float32")


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "attention", help="time the paged-attention kernels against the KV-read floor; "
                          "--tune searches the kernels' tiles",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b",
                   help="a shipped config name (loom/bench/configs), a model directory or a "
                        "config.json (default llama-3.1-8b)")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1,
                   help="each rank holds heads / TP query heads and KV heads / TP (at least 1)")
    p.add_argument("--mode", choices=("decode", "prefill", "mixed", "verify"),
                   default="decode",
                   help="decode: B one-token queries; prefill: prompt chunks alone; mixed: "
                        "the decodes beside prompt chunks; verify: B queries of --query-len "
                        "tokens (speculative decoding)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=list(DEFAULT_BATCH_SIZES),
                   help="decoding requests per step")
    p.add_argument("--context-lens", type=int, nargs="+", default=list(DEFAULT_CONTEXT_LENS),
                   help="each decoding request's length (its cached tokens + its query)")
    p.add_argument("--prompt-tokens", type=int, default=8192,
                   help="prefill, mixed: prompt-chunk tokens in the step")
    p.add_argument("--chunk-len", type=int, default=1024,
                   help="prefill, mixed: tokens per prompt chunk (the last takes the remainder)")
    p.add_argument("--query-len", type=int, default=5,
                   help="verify mode: each request's query tokens (1 + num_speculative_tokens)")
    p.add_argument("--chunk-context", type=int, nargs="+", default=[0],
                   help="prefill, mixed: tokens already cached before each chunk (0: whole "
                        "prompts); one shape per value")
    p.add_argument("--block-size", type=int, default=None,
                   help="KV cache block size (default: the engine's, CacheConfig.block_size)")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="default bfloat16 (float32 in Triton's interpreter)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                   help="the cache's element type, as the engine's flag (auto: --dtype)")
    p.add_argument("--num-iters-warmup", type=int, default=3)
    p.add_argument("--num-iters", type=int, default=20, help="timed replays per result")
    p.add_argument("--tune", action="store_true",
                   help="decode: sweep block_n, num_warps, num_stages and num_splits per shape; "
                        "prefill: block_m, block_n, num_warps and num_stages")
    p.add_argument("--tune-block-n", type=int, nargs="+", default=list(TUNE_BLOCK_N))
    p.add_argument("--tune-warps", type=int, nargs="+", default=list(TUNE_WARPS))
    p.add_argument("--tune-stages", type=int, nargs="+", default=list(TUNE_STAGES))
    p.add_argument("--tune-splits", type=int, nargs="+", default=list(TUNE_SPLITS),
                   help="split counts tried besides default_num_splits' choice")
    p.add_argument("--tune-prefill-block-m", type=int, nargs="+",
                   default=list(TUNE_PREFILL_BLOCK_M))
    p.add_argument("--tune-prefill-block-n", type=int, nargs="+",
                   default=list(TUNE_PREFILL_BLOCK_N))
    p.add_argument("--tune-prefill-warps", type=int, nargs="+", default=list(TUNE_PREFILL_WARPS))
    p.add_argument("--tune-prefill-stages", type=int, nargs="+",
                   default=list(TUNE_PREFILL_STAGES))
    p.add_argument("--tune-prefill-mask-all", type=int, nargs="+", choices=(0, 1), default=[0],
                   help="1: also time each tile with every key tile masked (the kernel "
                        "before its interior tiles went unmasked)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", default=None)
    p.set_defaults(func=run_attention)


# -- one shape ---------------------------------------------------------------------------------
def _figures(us: float, nbytes: int, flops: int, ceilings) -> dict[str, Any]:
    floor_us = None
    if ceilings is not None:
        floor_us = (nbytes / (ceilings.copy_tb_per_s * 1e12)
                    + flops / (ceilings.matmul_tflop_per_s * 1e12)) * 1e6
    return {"us": us, "gbps": nbytes / (us * 1e-6) / 1e9, "tflops": flops / (us * 1e-6) / 1e12,
            "floor_us": floor_us,
            "ratio_to_floor": us / floor_us if floor_us else None}


def run_shape(step: Step, shape: AttentionShape, args: argparse.Namespace, env: dict[str, Any],
              timer: KernelTimer) -> dict[str, Any]:
    from loom.attention.mixed_split import split_by_query_len
    from loom.attention.triton_backend import TritonBackend
    inputs = make_inputs(step, shape, args.block_size, env["dtype"], env["device"],
                         args.seed * 1_000_003 + len(step.seq_lens) * 7919 + step.seq_lens[0],
                         env["kv_dtype"])
    ref = reference(inputs, step)
    timer.spin()
    dtype, elem = args.dtype, inputs.query.element_size()
    nbytes = step_bytes(step, shape, elem, inputs.kv_cache.element_size())
    flops = step_flops(step, shape)
    num_decodes = sum(q == 1 for q in step.query_lens)
    backend = TritonBackend()
    splits_by_default = split_by_query_len(inputs.meta, inputs.query.device,
                                           backend.mixed_split_min_decodes,
                                           backend.mixed_split_min_context) is not None
    if args.mode == "mixed":  # the split path whatever the step (the single launch beside)
        backend.mixed_split_min_decodes = 1
    single_beside = args.mode in ("mixed", "verify")
    call = backend_call(backend, inputs)
    with recorded_launches() as launches:
        err = checked(call, ref, dtype, f"the backend's {args.mode} path")
    us = timer.time_us(call)
    # verify: its requests, and the tokens cached before their queries
    batch, context = ((len(step.seq_lens), step.seq_lens[0] - step.query_lens[0])
                      if args.mode == "verify" else (num_decodes, step.seq_lens[0]))
    row: dict[str, Any] = {
        "mode": args.mode, "batch_size": batch, "context_len": context,
        "num_tokens": step.num_tokens, "bytes": nbytes, "flops": flops,
        **_figures(us, nbytes, flops, env["ceilings"]), "launches": launches,
        "max_rel_error": err, "timed_with": timer.method}
    if args.mode != "decode":
        chunks = list(zip(step.query_lens, step.seq_lens))[num_decodes:]
        row["prompt_chunks"] = [{"query_len": q, "seq_len": s} for q, s in chunks]
    if args.mode == "mixed":
        row["split_by_default"] = splits_by_default
    if single_beside:
        single, config = single_launch_call(backend, inputs)
        single_err = checked(single, ref, dtype, "the single paged_prefill launch")
        single_us = timer.time_us(single)
        row["single_launch"] = {**_figures(single_us, nbytes, flops, env["ceilings"]),
                                "launches": [config], "max_rel_error": single_err,
                                "timed_with": timer.method}
        row["speedup_over_single_launch"] = row["single_launch"]["us"] / row["us"]
    if args.tune:
        best = tune(inputs, step, shape, ref, timer, args, dtype)
        row["tuned"] = {**best, **_figures(best["us"], nbytes, flops, env["ceilings"]),
                        "speedup": row["us"] / best["us"]}
    return row


def _fmt_launch(launch: dict[str, Any]) -> str:
    keys = ("block_m", "block_n", "num_splits", "num_warps", "num_stages", "mask_all",
            "q_tokens")
    tiles = " ".join(f"{k}={launch[k]}" for k in keys
                     if k in launch and (k != "q_tokens" or launch[k] > 1))
    return f"{launch['kernel'].removeprefix('paged_')}({tiles})"


def _line(row: dict[str, Any]) -> str:
    def timing(r: dict[str, Any]) -> str:
        ratio = f"{r['ratio_to_floor']:5.2f}x floor" if r["ratio_to_floor"] else "no floor"
        rate = f"{r['tflops']:>5.0f} TFLOP/s" if r["tflops"] else f"{r['gbps']:>7.0f} GB/s"
        return f"{r['us']:>10.1f} us {rate} {ratio}"
    text = (f"B={row['batch_size']:>5} ctx={row['context_len']:>6}  {timing(row)}  "
            f"{' + '.join(_fmt_launch(c) for c in row['launches'])}")
    if "single_launch" in row:
        taken = ("" if "split_by_default" not in row else "; the backend takes "
                 + ("the split" if row["split_by_default"] else "one launch"))
        text += (f"\n{'':>19}single launch {timing(row['single_launch'])} (the "
                 f"{row['mode']} path: {row['speedup_over_single_launch']:.2f}x as fast{taken})")
    if "tuned" in row:
        t = row["tuned"]
        kernel = "prefill" if "block_m" in t["config"] else "decode"
        text += (f"\n{'':>19}tuned {timing(t)}  {t['speedup']:.2f}x  "
                 f"{_fmt_launch({'kernel': kernel, **t['config']})}")
    return text


# -- the command -------------------------------------------------------------------------------
def _interpreted() -> bool:
    """Whether the paged-attention kernels were built for Triton's CPU interpreter."""
    from loom.kernels import paged_decode
    from loom.kernels.interpreter import interpreted
    return interpreted(paged_decode._decode_split_kernel)


def _validate(args: argparse.Namespace) -> None:
    positive = {"batch_sizes": args.batch_sizes, "context_lens": args.context_lens,
                "tune_block_n": args.tune_block_n, "tune_warps": args.tune_warps,
                "tune_stages": args.tune_stages, "tune_splits": args.tune_splits,
                "tune_prefill_block_m": args.tune_prefill_block_m,
                "tune_prefill_block_n": args.tune_prefill_block_n,
                "tune_prefill_warps": args.tune_prefill_warps,
                "tune_prefill_stages": args.tune_prefill_stages}
    for name, values in positive.items():
        if not values or min(values) < 1:
            raise ValueError(f"{name}: must be positive, got {values}")
    if args.num_iters < 1 or args.num_iters_warmup < 0:
        raise ValueError("num_iters must be positive and num_iters_warmup >= 0")
    from loom.attention.mixed_split import SHORT_QUERY_TOKENS
    if args.mode == "verify" and not 2 <= args.query_len <= SHORT_QUERY_TOKENS:
        raise ValueError(f"verify: query_len must be 2 to {SHORT_QUERY_TOKENS} tokens (1 + "
                         f"num_speculative_tokens), got {args.query_len}")
    if args.mode in ("mixed", "prefill") and (args.prompt_tokens < 2 or args.chunk_len < 2
                                  or args.prompt_tokens % args.chunk_len == 1
                                  or not args.chunk_context or min(args.chunk_context) < 0):
        raise ValueError(f"{args.mode}: prompt_tokens, chunk_len and the last chunk must be at "
                         "least 2 tokens (a chunk of one token is a decode), chunk_context >= 0")
    if args.tune and args.mode in ("mixed", "verify"):
        raise ValueError("tune: sweeps one kernel's tiles; run it with --mode decode or prefill")
    if args.block_size is not None and (args.block_size < 1
                                        or args.block_size & (args.block_size - 1)):
        raise ValueError(f"block_size: must be a positive power of two, got {args.block_size}")


def _environment(args: argparse.Namespace) -> dict[str, Any]:
    """The device, dtype and ceilings; a clear error where the kernels cannot run."""
    import torch
    try:
        import triton  # noqa: F401
    except ImportError:
        raise ValueError("attention: triton is not installed (pip install 'loom[triton]')") \
            from None
    interpreted = _interpreted()
    if torch.cuda.is_available():
        if interpreted:
            raise ValueError("attention: TRITON_INTERPRET is set: the kernels would run on "
                             "the CPU interpreter; unset it to time them on the GPU")
        device = torch.device("cuda", torch.cuda.current_device())
    elif interpreted:
        device = torch.device("cpu")
        from loom.kernels.interpreter import patch_interpreter
        patch_interpreter()
        if args.dtype == "bfloat16":
            raise ValueError("attention: Triton's interpreter mishandles bfloat16; use "
                             "--dtype float32 or float16 on the CPU")
    else:
        raise ValueError("attention: needs a CUDA GPU to time the Triton kernels, and torch "
                         "sees none; to run tiny shapes on the CPU instead, start it with "
                         "TRITON_INTERPRET=1 (Triton's interpreter)")
    args.dtype = args.dtype or ("float32" if interpreted else "bfloat16")
    from loom.bench import ceilings as ceilings_module
    # Before any input is drawn: the copy buffers then leave the memory to the caches.
    ceilings = ceilings_module.measure_ceilings(device)
    name = ceilings_module.device_name(device)
    from loom.worker.model_loader import resolve_kv_cache_dtype
    dtype = getattr(torch, args.dtype)
    return {"device": device, "device_name": name, "dtype": dtype,
            "kv_dtype": resolve_kv_cache_dtype(args.kv_cache_dtype, dtype),
            "ceilings": ceilings, "interpreted": interpreted}


def run_attention(args: argparse.Namespace) -> int:
    _validate(args)
    shape = attention_shape(args.model, args.tensor_parallel_size)
    if args.block_size is None:
        from loom.config import CacheConfig
        args.block_size = CacheConfig().block_size
    env = _environment(args)
    import torch
    ceilings = env["ceilings"]
    print(f"{env['device_name']}: {shape.num_heads} heads, {shape.num_kv_heads} KV heads, "
          f"head_dim {shape.head_dim} (TP {args.tensor_parallel_size}), {args.dtype} "
          f"(KV cache {str(env['kv_dtype']).removeprefix('torch.')}), "
          f"block size {args.block_size}, {args.mode}", flush=True)
    if ceilings is not None:
        print(f"ceilings: copy {ceilings.copy_tb_per_s:.2f} TB/s (read+write), bf16 matmul "
              f"{ceilings.matmul_tflop_per_s:.0f} TFLOP/s", flush=True)
    timer = KernelTimer(env["device"], args.num_iters_warmup, args.num_iters,
                        fall_back_to_launches=True)
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    decode_shapes = (dict.fromkeys(args.context_lens), dict.fromkeys(args.batch_sizes))
    if args.mode == "prefill":  # no decodes: the batch and context flags do not apply
        decode_shapes = ((0,), (0,))
    chunk_contexts = ((0,) if args.mode in ("decode", "verify")
                      else dict.fromkeys(args.chunk_context))
    for ctx, batch, chunk_context in itertools.product(*decode_shapes, chunk_contexts):
        step = (decode_step(batch, ctx) if args.mode == "decode" else
                verify_step(batch, ctx, args.query_len) if args.mode == "verify" else
                mixed_step(batch, ctx, args.prompt_tokens, args.chunk_len, chunk_context))
        try:
            row = run_shape(step, shape, args, env, timer)
        except torch.OutOfMemoryError:
            gb = step_bytes(step, shape, env["dtype"].itemsize, env["kv_dtype"].itemsize) / 1e9
            raise ValueError(f"attention: B={batch} ctx={ctx} does not fit in device memory "
                             f"(its KV cache alone is {gb:.1f} GB); drop that shape") from None
        rows.append(row)
        print(_line(row), flush=True)
        if env["device"].type == "cuda":
            torch.cuda.empty_cache()
    elapsed = time.perf_counter() - started
    print(f"{len(rows)} shapes in {elapsed:.0f} s")
    if args.output_json:
        payload = {
            "benchmark": "attention", "date": now_iso(), "git_commit": git_commit(),
            "command": command_line(), "device": env["device_name"],
            "ceilings": dataclasses.asdict(ceilings) if ceilings is not None else None,
            "floor": "bytes / copy rate" + (" + prompt-chunk attention FLOPs / matmul rate"
                                            if args.mode != "decode" else ""),
            "model": args.model, "tensor_parallel_size": args.tensor_parallel_size,
            "num_heads": shape.num_heads, "num_kv_heads": shape.num_kv_heads,
            "head_dim": shape.head_dim, "dtype": args.dtype,
            "kv_cache_dtype": str(env["kv_dtype"]).removeprefix("torch."),
            "block_size": args.block_size,
            "mode": args.mode, "tuned": args.tune, "interpreted": env["interpreted"],
            "num_iters": args.num_iters, "elapsed_s": elapsed, "rows": rows}
        print(f"Wrote {write_json(args.output_json, payload)}")
    return 0

