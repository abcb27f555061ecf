"""The fused MoE's launch configs: which tiles (or the GEMV kernels) a call of T tokens takes.

A config is BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages, GEMV and TMA: one passed
in, else a tuned one (`loom bench moe --tune` writes them: one JSON file per expert count,
intermediate size per shard, dtype and device, mapping a token count M to a config; the key
nearest to M is used), else the defaults below. fp8 experts look up their own dtype's
(float8_e4m3fn) file first, then the activations' dtype's; int4 experts (W4A16) the
`dtype=int4_w4a16` file, 8-bit ones `dtype=int8_w8a16`, else the defaults. vLLM's key names
are accepted, so its tuned files read as they are.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from typing import Any

import torch

from loom.kernels.tuned import config_dir, device_name

logger = logging.getLogger(__name__)


def _default_block_m(num_slots: int, num_experts: int) -> int:
    # Few rows per expert (decode) waste most of a tall tile on padding.
    per_expert = num_slots / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages", "GEMV",
               "TMA")
# vLLM's names for the same things, accepted in a config so its tuned files read as they are.
_ALIASES = {"BLOCK_SIZE_M": "BLOCK_M", "BLOCK_SIZE_N": "BLOCK_N", "BLOCK_SIZE_K": "BLOCK_K",
            "GROUP_SIZE_M": "GROUP_M"}


def default_config(num_tokens: int, top_k: int, num_experts: int,
                   dtype: torch.dtype) -> dict[str, int]:
    """The launch used where no tuned config applies: where the tokens leave each expert half
    a row or less (decode), the GEMV kernels, 8 rows by 512 columns a chunk (the shipped
    H200 tables pick them up to there; on an untuned H100 the grouped GEMM's 16-row tiles
    made Qwen3-30B-A3B's int4 decode 4.9x its floor, h100-session47-zzz113); else the
    grouped GEMM's tiles (`gemm_defaults`)."""
    if 2 * num_tokens * top_k <= num_experts:
        return {**gemm_defaults(num_tokens, top_k, num_experts, dtype), "BLOCK_N": 8,
                "BLOCK_K": 512, "GEMV": 1}
    return gemm_defaults(num_tokens, top_k, num_experts, dtype)


def gemm_defaults(num_tokens: int, top_k: int, num_experts: int,
                  dtype: torch.dtype) -> dict[str, int]:
    """The grouped GEMM's built-in tiles; they also fill the keys a given or tuned config
    leaves out (one without GEMV means the grouped GEMM)."""
    # fp32 takes exact FMA dots whose operands need far more registers: halve the tile
    # (the sizes that ptxas compiles without spills for sm_90).
    tile = 32 if dtype == torch.float32 else 64
    return {"BLOCK_M": _default_block_m(num_tokens * top_k, num_experts), "BLOCK_N": tile,
            "BLOCK_K": tile, "GROUP_M": 1, "num_warps": 4, "num_stages": 3, "GEMV": 0,
            "TMA": 0}


def normalize_config(config: dict[str, Any]) -> dict[str, int]:
    """A config with loom's key names, checked: tile sizes powers of two >= 16 (tl.dot's
    minimum; BLOCK_N >= 1 for the GEMV kernels, which take no dot), GROUP_M, num_warps and
    num_stages positive, GEMV 0 or 1 (1: loom/kernels/moe_gemv.py's two kernels with
    BLOCK_N, BLOCK_K, num_warps and num_stages), TMA 0 or 1 (1: the grouped GEMM loads the
    weights, and down its activations, through TMA descriptors; not with GEMV). Keys it
    lacks stay absent."""
    out: dict[str, int] = {}
    for key, value in config.items():
        name = _ALIASES.get(key, key)
        if name not in CONFIG_KEYS:
            raise ValueError(f"fused_moe config: unknown key {key!r}; known: {list(CONFIG_KEYS)}")
        out[name] = int(value)
    for flag in ("GEMV", "TMA"):
        if out.get(flag, 0) not in (0, 1):
            raise ValueError(f"fused_moe config: {flag} must be 0 or 1, got {out[flag]}")
    if out.get("GEMV") and out.get("TMA"):
        raise ValueError("fused_moe config: TMA applies to the grouped GEMM, not to GEMV = 1")
    for name, value in out.items():
        least = 1 if name == "BLOCK_N" and out.get("GEMV") else 16
        if name.startswith("BLOCK_") and (value < least or value & (value - 1)):
            raise ValueError(f"fused_moe config: {name} must be a power of two >= {least}, "
                             f"got {value}")
        if name not in ("GEMV", "TMA") and value < 1:
            raise ValueError(f"fused_moe config: {name} must be positive, got {value}")
    return out


INT4_TABLE_DTYPE = "int4_w4a16"
"""The dtype key of int4 experts' tuned files (their weights are int32 words, which would
say nothing): `E=..,N=..,dtype=int4_w4a16,device_name=...json`."""
INT8_TABLE_DTYPE = "int8_w8a16"
"""The dtype key of 8-bit integer experts' tuned files (their int32 words would read as
int4's; `moe_quant.table_dtype`)."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def table_dtype(weight: torch.Tensor) -> torch.dtype | str:
    """The dtype that names a stacked expert weight's tuned file: its own, or for int4
    (int32 packed) experts INT4_TABLE_DTYPE."""
    return INT4_TABLE_DTYPE if weight.dtype == torch.int32 else weight.dtype


def config_file_name(num_experts: int, inter: int, dtype: torch.dtype | str,
                     device_name: str) -> str:
    """E=128,N=768,dtype=bfloat16,device_name=NVIDIA_H200.json (N: intermediate per shard)."""
    dtype = dtype if isinstance(dtype, str) else _dtype_name(dtype)
    device = device_name.replace(" ", "_")
    return f"E={num_experts},N={inter},dtype={dtype},device_name={device}.json"


ConfigTable = tuple[tuple[int, tuple[tuple[str, int], ...]], ...]


@functools.cache
def load_config_file(path: str) -> ConfigTable | None:
    """A tuned file as ((M, ((key, value), ...)), ...) sorted by M; None if there is none.
    Read once per path (functools.cache); load_config_file.cache_clear() forgets them."""
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        raw = json.load(f)
    try:
        table = tuple(sorted((int(m), tuple(sorted(normalize_config(c).items())))
                             for m, c in raw.items()))
    except (AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"fused_moe config file {path}: {e}") from None
    if not table:
        raise ValueError(f"fused_moe config file {path}: no entries")
    return table


@torch.compiler.assume_constant_result
def _tuned_table(num_experts: int, inter: int, dtype: torch.dtype,
                 device: torch.device, quiet: bool = False) -> ConfigTable | None:
    # A constant to torch.compile: it runs this once while tracing (files, device
    # queries) and keeps the result, so the lookup never breaks the graph.
    name = config_file_name(num_experts, inter, dtype, device_name(device))
    table = load_config_file(str(config_dir() / name))
    if table is None and device.type == "cuda" and not quiet:
        _say_untuned(str(config_dir() / name))
    return table


@functools.cache
def _say_untuned(path: str) -> None:
    logger.info("fused_moe: no tuned configs (%s); the built-in tiles serve every batch "
                "size (`loom bench moe --tune` measures this GPU's)", path)


def nearest_config(table: ConfigTable, num_tokens: int) -> dict[str, int]:
    """The config of the key nearest to num_tokens, the smaller key on a tie. Written as
    comparisons against midpoints so that a symbolic token count under torch.compile gets
    one range guard per key crossed."""
    for i in range(len(table) - 1):
        if 2 * num_tokens <= table[i][0] + table[i + 1][0]:
            return dict(table[i][1])
    return dict(table[-1][1])


def get_config(num_tokens: int, top_k: int, num_experts: int, inter: int,
               dtype: torch.dtype, device: torch.device | str,
               config: dict[str, Any] | None = None,
               weight_dtype: torch.dtype | str | None = None) -> dict[str, int]:
    """The full config fused_moe launches with: `config` if given, else the tuned one
    nearest num_tokens for this E, N (= inter, per shard), dtype and device, else the
    defaults; keys the chosen one lacks come from the defaults. dtype is the activations';
    weight_dtype, where it differs (fp8 experts; int4 ones: INT4_TABLE_DTYPE, see
    `table_dtype`; their int32 dtype reads as it), names the table looked up first."""
    if weight_dtype == torch.int32:
        weight_dtype = INT4_TABLE_DTYPE
    if config is not None:
        chosen = normalize_config(config)
    else:
        table = _table(num_experts, inter, dtype, weight_dtype, torch.device(device))
        chosen = nearest_config(table, num_tokens) if table is not None else {}
        if chosen:  # files tuned before the GEMV kernels existed mean the grouped GEMM
            chosen.setdefault("GEMV", 0)
            chosen.setdefault("TMA", 0)
    if not chosen:
        return default_config(num_tokens, top_k, num_experts, dtype)
    if len(chosen) < len(CONFIG_KEYS):
        # Only when needed: under torch.compile the default BLOCK_M adds range guards of
        # its own, which a complete tuned config should not bring along.
        chosen = {**gemm_defaults(num_tokens, top_k, num_experts, dtype), **chosen}
    return chosen


def _table(num_experts: int, inter: int, dtype: torch.dtype,
           weight_dtype: torch.dtype | str | None,
           device: torch.device) -> ConfigTable | None:
    """The weights' own table. fp8 weights without one take the activations' dtype's: the
    same tiles read half the weight bytes, a fair start until `loom bench moe --tune
    --weight-dtype fp8` measures their own (said once). Integer experts (int4, 8-bit) without
    one take the built-in defaults (said once): on an H100 Qwen3-30B-A3B GPTQ-Int4 ran
    throughput 1.24x faster and decode 1.03x faster on the defaults than on the tiles
    the bf16 table tuned for 2-byte weights (h100-session54-zzz131, -zzz134)."""
    if weight_dtype is None or weight_dtype == dtype:
        return _tuned_table(num_experts, inter, dtype, device)
    table = _tuned_table(num_experts, inter, weight_dtype, device, quiet=True)
    if table is not None:
        return table
    integer = weight_dtype in (INT4_TABLE_DTYPE, INT8_TABLE_DTYPE)
    table = None if integer else _tuned_table(num_experts, inter, dtype, device)
    if device.type == "cuda" and (integer or table is not None):
        name = device_name(device)
        _say_fallback(config_file_name(num_experts, inter, weight_dtype, name),
                      None if integer else config_file_name(num_experts, inter, dtype, name))
    return table


@functools.cache
def _say_fallback(missing: str, used: str | None) -> None:
    kind = next((k for k, key in (("int4", INT4_TABLE_DTYPE), ("int8", INT8_TABLE_DTYPE))
                 if key in missing), "fp8")
    logger.info("fused_moe: no tuned configs for %s experts (%s); their calls take %s",
                kind, missing, f"{used}'s tiles" if used else "the built-in defaults")
