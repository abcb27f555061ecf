"""The fused-MoE bench's model shapes and search space: the expert shapes a model's config
gives one rank (`moe_shape`), and the tile configs `loom bench moe --tune` tries per batch
size (`search_space`, `gemv_space`, `group_variants`), pruned by what fits a Hopper block
(`fits`)."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The largest dynamic shared memory a Hopper block may take, and the most fp32 accumulator
# values per thread before ptxas spills: configs over either are not tried.
SMEM_LIMIT = 227 * 1024
ACC_PER_THREAD_LIMIT = 128


# -- the model's expert shapes -----------------------------------------------------------------
@dataclass(frozen=True)
class MoeShape:
    hidden: int
    inter: int
    """Intermediate size of one expert on one rank (moe_intermediate_size / TP)."""
    num_experts: int
    top_k: int

    def flops(self, num_tokens: int) -> int:
        return 6 * num_tokens * self.top_k * self.hidden * self.inter

    def expert_bytes(self, elem_size: int) -> int:
        return 3 * self.hidden * self.inter * elem_size


def model_config_json(model: str) -> dict[str, Any]:
    """The config.json (as a dict) of a shipped config name, a model directory or a path."""
    from loom.models.loader import SHIPPED_CONFIGS, shipped_config
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    elif not (path.is_file() and path.suffix == ".json"):
        path = shipped_config(model) or Path("/nonexistent")
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.json")))
        raise ValueError(f"model: {model!r} is not a model directory, a config.json or a "
                         f"shipped config ({known})")
    return json.loads(path.read_text())


def moe_shape(model: str, tp: int) -> MoeShape:
    hf = model_config_json(model)
    hf = hf.get("text_config", hf) if "num_experts_per_tok" not in hf else hf
    experts = hf.get("num_experts") or hf.get("num_local_experts")
    inter = hf.get("moe_intermediate_size") or (
        hf.get("intermediate_size") if hf.get("num_local_experts") else None)
    if not (experts and inter and hf.get("num_experts_per_tok") and hf.get("hidden_size")):
        raise ValueError(f"model: {model} is not a mixture-of-experts config (needs "
                         "hidden_size, moe_intermediate_size, num_experts, num_experts_per_tok)")
    if tp < 1 or inter % tp:
        raise ValueError(f"tensor_parallel_size: {tp} does not divide the experts' "
                         f"intermediate size {inter}")
    return MoeShape(hidden=int(hf["hidden_size"]), inter=int(inter) // tp,
                    num_experts=int(experts), top_k=int(hf["num_experts_per_tok"]))


# -- the search grid ---------------------------------------------------------------------------
def tile_config(bm: int, bn: int, bk: int, group: int, warps: int, stages: int,
                gemv: int = 0, tma: int = 0) -> dict[str, int]:
    return {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group,
            "num_warps": warps, "num_stages": stages, "GEMV": gemv, "TMA": tma}


def fits(config: dict[str, int], elem_size: int = 2) -> bool:
    """Whether gate_up (the larger kernel: an activation tile, two weight tiles and two
    accumulators) plausibly fits: pipelined tiles in shared memory, accumulators in
    registers. What slips through and still fails is skipped when it fails. The GEMV
    kernels' grid (gemv_space) is sized by hand."""
    if config.get("GEMV"):
        return True
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    smem = config["num_stages"] * (bm * bk + 2 * bk * bn) * elem_size
    acc = 2 * bm * bn / (32 * config["num_warps"])
    return smem <= SMEM_LIMIT and acc <= ACC_PER_THREAD_LIMIT


def search_space(shape: MoeShape, num_tokens: int,
                 bytes_per_weight: float = 2) -> list[dict[str, int]]:
    """The first pass's configs for M = num_tokens, all with GROUP_M = 1, by rows per
    expert: a row block never spans two experts, so tall blocks only pay off when each
    expert has many rows, and decode is a weight stream, where narrow column tiles make
    more programs and deep K tiles keep more loads in flight. From 128 rows an expert
    (prompt sizes), each config also with TMA = 1. Where the tokens leave each expert two
    rows or fewer, also the GEMV kernels (gemv_space, for weights of bytes_per_weight)."""
    per_expert = num_tokens * shape.top_k / shape.num_experts
    if per_expert < 2:
        space = [(16,), (32, 64, 128), (64, 128, 256), (4, 8), (3, 4, 5)]
    elif per_expert < 8:
        space = [(16, 32), (32, 64, 128), (64, 128, 256), (4, 8), (3, 4, 5)]
    elif per_expert < 32:
        space = [(16, 32, 64), (64, 128), (64, 128, 256), (4, 8), (3, 4, 5)]
    elif per_expert < 128:
        space = [(32, 64, 128), (64, 128, 256), (32, 64, 128), (4, 8), (3, 4, 5)]
    else:
        space = [(64, 128), (64, 128, 256), (32, 64, 128), (4, 8), (3, 4, 5)]
    bms, bns, bks, warps, stages = space
    configs = [tile_config(bm, bn, bk, 1, w, s)
               for bm, bn, bk, w, s in itertools.product(bms, bns, bks, warps, stages)]
    # 8 warps need a tile of at least 64 x 64 to share.
    configs = [c for c in configs if fits(c) and (c["num_warps"] == 4 or
                                                  c["BLOCK_M"] * c["BLOCK_N"] >= 64 * 64)]
    if per_expert >= 128:  # prompt sizes, compute-bound: also each tile through TMA
        configs += [{**c, "TMA": 1} for c in configs]
    return configs + (gemv_space(bytes_per_weight) if per_expert <= 2 else [])


def gemv_space(bytes_per_weight: float = 2) -> list[dict[str, int]]:
    """loom/kernels/moe_gemv.py's configs: a few rows per program streamed in long K chunks
    (the dense GEMV's winners at batch 1 had 8 rows and 1024 columns), each thread's share
    of a chunk at most 128 bytes of weights so that it stays in registers (bf16 at 4 warps:
    8192 values), and at least a 4-byte word. From one warp: packed int4 weights take
    wide chunks on few threads (int4_gemv's one-row winner: 8 x 256 on one warp)."""
    configs = []
    for bn, bk, w, s in itertools.product((4, 8, 16, 32), (256, 512, 1024), (1, 2, 4, 8),
                                          (2, 3, 4)):
        per_thread = bn * bk * bytes_per_weight / (32 * w)
        if 4 <= per_thread <= 128:
            configs.append(tile_config(16, bn, bk, 1, w, s, gemv=1))
    return configs


def group_variants(shape: MoeShape, num_tokens: int,
                   config: dict[str, int]) -> list[dict[str, int]]:
    """GROUP_M variants of a config, where there are enough row blocks for the launch
    order to matter (several per expert)."""
    if num_tokens * shape.top_k / shape.num_experts < 32:
        return []
    return [{**config, "GROUP_M": g} for g in (8, 16)]
