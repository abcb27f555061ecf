"""What `loom bench attention` times and checks: the backend's own call (and the launches it
makes), the one paged_prefill launch mixed steps took before, a kernel at given tiles, each
checked against the float32 torch reference; and `--tune`'s sweep of the tiles."""

from __future__ import annotations

import argparse
import contextlib
import inspect
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from loom.bench.attention_workload import AttentionShape, Inputs, Step, max_rel_error
from loom.bench.kernel_timing import KernelTimer, nan_fresh_tensors

# A row's error against the float32 reference must stay under this: bf16 rounding of the
# probabilities and of the output gives well under 1%; a wrong key, block or split gives
# tens of percent.
MAX_REL_ERROR = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4}
TUNE_BLOCK_N = (16, 32, 64, 128)
TUNE_WARPS = (2, 4, 8)
TUNE_STAGES = (1, 2, 3)
TUNE_SPLITS = (1, 2, 4, 8, 16)
TUNE_PREFILL_BLOCK_M = (64, 128)
TUNE_PREFILL_BLOCK_N = (32, 64, 128)
TUNE_PREFILL_WARPS = (4, 8)
TUNE_PREFILL_STAGES = (1, 2, 3, 4)
TOP_CONFIGS = 5
"""How many of the fastest tuned configs a row lists."""


class KernelMismatch(ValueError):
    """A kernel's output disagrees with the torch reference."""


@contextlib.contextmanager
def recorded_launches() -> Iterator[list[dict[str, Any]]]:
    """The tiles of every paged_decode / paged_prefill launch the backend makes meanwhile
    (what its current choice is, read rather than restated here)."""
    from loom.attention import triton_backend
    from loom.kernels.paged_attention import paged_prefill
    from loom.kernels.paged_decode import paged_decode
    entry = {"paged_decode": paged_decode, "paged_prefill": paged_prefill}
    tiles = {"paged_decode": ("num_reqs", "block_n", "num_splits", "num_warps", "num_stages",
                              "q_tokens"),
             "paged_prefill": ("num_reqs", "max_query_len", "block_m", "block_n", "num_warps",
                               "num_stages")}
    calls: list[dict[str, Any]] = []
    real = {name: getattr(triton_backend, name) for name in tiles}

    def spy(name: str) -> Callable:
        signature = inspect.signature(entry[name])  # the kernel module's, not a wrapper's

        def launch(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            calls.append({"kernel": name, **{k: bound.arguments[k] for k in tiles[name]},
                          "indexed": bound.arguments["req_index"] is not None})
            return real[name](*args, **kwargs)
        return launch

    for name in tiles:
        setattr(triton_backend, name, spy(name))
    try:
        yield calls
    finally:
        for name, fn in real.items():
            setattr(triton_backend, name, fn)


# -- timing ------------------------------------------------------------------------------------
# -- the variants timed ------------------------------------------------------------------------
def backend_call(backend, inputs: Inputs) -> Callable[[], Any]:
    """What a model layer runs: the backend's forward (decode, or the mixed split)."""
    return lambda: backend.forward(inputs.query, inputs.kv_cache, inputs.meta, inputs.scale)


def single_launch_call(backend, inputs: Inputs) -> tuple[Callable[[], Any], dict[str, Any]]:
    """The old mixed path: one paged_prefill over the whole batch, the backend's tiles."""
    q, meta = inputs.query, inputs.meta
    block_m, block_n, warps, stages = backend.prefill_tiles(q.shape[2], q.dtype)
    config = {"block_m": block_m, "block_n": block_n, "num_warps": warps, "num_stages": stages}
    return tiled_call(inputs, config), {"kernel": "paged_prefill", "num_reqs": meta.num_reqs,
                                        "max_query_len": meta.max_query_len, **config}


def tiled_call(inputs: Inputs, config: dict[str, int]) -> Callable[[], Any]:
    """One kernel over the whole batch with the given tiles, into a fresh output:
    paged_decode where the config has num_splits (a pure decode batch), else paged_prefill
    (mask_all 1: every key tile masked)."""
    import torch

    from loom.kernels.paged_attention import paged_prefill
    from loom.kernels.paged_decode import paged_decode
    q, meta = inputs.query, inputs.meta
    out = torch.full_like(q, float("nan"))
    common = (q, inputs.kv_cache, out, meta.block_table, meta.query_start_loc, meta.seq_lens,
              meta.num_reqs)
    tiles = {"block_n": config["block_n"], "num_warps": config["num_warps"],
             "num_stages": config["num_stages"]}
    if "num_splits" in config:
        return lambda: paged_decode(*common, inputs.scale, config["num_splits"], **tiles)
    return lambda: paged_prefill(
        *common, meta.max_query_len, inputs.scale, block_m=config["block_m"],
        mask_all=bool(config.get("mask_all", 0)), **tiles)


def checked(fn: Callable[[], Any], ref, dtype: str, what: str) -> float:
    """fn's worst row error against the reference; KernelMismatch over the tolerance."""
    with nan_fresh_tensors():
        err = max_rel_error(fn(), ref)
    limit = MAX_REL_ERROR[dtype]
    if not err <= limit:
        raise KernelMismatch(f"attention: {what} disagrees with the torch reference: worst "
                             f"per-(token, head) relative error {err:.3g} > {limit:g}")
    return err


def tune_configs(step: Step, shape: AttentionShape, args: argparse.Namespace
                 ) -> list[dict[str, int]]:
    """The sweep for one decode shape: every tile with the split count default_num_splits
    picks for its block_n and those of the others that leave no split empty."""
    from loom.kernels.paged_decode import default_num_splits
    num_reqs, ctx = len(step.seq_lens), max(step.seq_lens)
    configs = []
    for block_n, warps, stages in itertools.product(
            sorted(set(args.tune_block_n)), sorted(set(args.tune_warps)),
            sorted(set(args.tune_stages))):
        default = default_num_splits(num_reqs, shape.num_kv_heads, ctx, block_n)
        for splits in sorted({default, *args.tune_splits}):
            if splits == default or _no_empty_split(ctx, block_n, splits):
                configs.append({"block_n": block_n, "num_warps": warps, "num_stages": stages,
                                "num_splits": splits})
    return configs


def _no_empty_split(seq_len: int, block_n: int, splits: int) -> bool:
    """Whether every split gets keys: each covers the kernel's block_n-aligned share."""
    split_len = -(-(-(-seq_len // splits)) // block_n) * block_n
    return (splits - 1) * split_len < seq_len


def prefill_tune_configs(args: argparse.Namespace) -> list[dict[str, int]]:
    """The prefill sweep; `mask_all` 1 (the kernel masking every key tile, as before its
    interior tiles went unmasked) only where --tune-prefill-mask-all asks for it."""
    configs = []
    for m, n, w, st, mask_all in itertools.product(
            sorted(set(args.tune_prefill_block_m)), sorted(set(args.tune_prefill_block_n)),
            sorted(set(args.tune_prefill_warps)), sorted(set(args.tune_prefill_stages)),
            sorted(set(args.tune_prefill_mask_all))):
        config = {"block_m": m, "block_n": n, "num_warps": w, "num_stages": st}
        configs.append({**config, "mask_all": 1} if mask_all else config)
    return configs


def tune(inputs: Inputs, step: Step, shape: AttentionShape, ref, timer: KernelTimer,
         args: argparse.Namespace, dtype: str) -> dict[str, Any]:
    """Every config of the mode's sweep timed; the fastest that matches the reference."""
    configs = (tune_configs(step, shape, args) if args.mode == "decode"
               else prefill_tune_configs(args))
    timed: list[tuple[float, dict[str, int]]] = []
    skipped: list[str] = []
    for config in configs:
        try:
            timed.append((timer.time_us(tiled_call(inputs, config)), config))
        except Exception as e:  # noqa: BLE001 - out of shared memory, a compile failure
            text = str(e).strip().splitlines()
            skipped.append(f"{config}: {type(e).__name__}: {text[0] if text else ''}"[:200])
    if not timed:
        raise ValueError(f"attention: no {args.mode} config ran: {skipped[:3]}")
    timed.sort(key=lambda t: t[0])
    rejected = []
    for us, config in timed:
        try:
            err = checked(tiled_call(inputs, config), ref, dtype, f"{args.mode} config {config}")
        except KernelMismatch as e:
            rejected.append(str(e))
            continue
        return {"config": config, "us": us, "max_rel_error": err, "searched": len(timed),
                "top": [{"us": t, "config": c} for t, c in timed[:TOP_CONFIGS]],
                "skipped": skipped, "rejected": rejected}
    raise KernelMismatch(f"attention: every tuned config disagrees with the reference: "
                         f"{rejected[:3]}")
