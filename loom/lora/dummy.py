"""A random LoRA adapter for a model, in PEFT's layout: what `--lora-path dummy` benchmarks
with (as `--load-format dummy` gives random weights), and what GPU tests load without
peft installed."""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import save_file

from loom.lora.adapter import CONFIG_FILE, PREFIX, PROJECTIONS, WEIGHTS_FILE


def write_dummy_adapter(targets: dict[str, list[int]], out_dir: str, rank: int,
                        alpha: float | None = None, seed: int = 0,
                        projections: tuple[str, ...] = PROJECTIONS) -> str:
    """Write an adapter of this rank on every module in targets (`adapter.model_targets`)
    whose projection is listed, with random A and B scaled so that its term is of the
    order of the layer's own output; return out_dir."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for module, (out, in_) in targets.items():
        if module.rpartition(".")[2] not in projections:
            continue
        tensors[f"{PREFIX}{module}.lora_A.weight"] = torch.randn(rank, in_, generator=gen) / in_ ** 0.5
        tensors[f"{PREFIX}{module}.lora_B.weight"] = torch.randn(out, rank, generator=gen) * 0.5
    os.makedirs(out_dir, exist_ok=True)
    save_file(tensors, os.path.join(out_dir, WEIGHTS_FILE))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha or rank, "bias": "none",
              "target_modules": sorted(projections), "use_rslora": False, "use_dora": False}
    with open(os.path.join(out_dir, CONFIG_FILE), "w") as f:
        json.dump(config, f, indent=1)
    return out_dir
