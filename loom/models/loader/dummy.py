"""Random weights for benchmarking large architectures without their checkpoints.

Each parameter is filled where it lives (on its device, in its dtype, this rank's shard
only), from a generator seeded by (seed, parameter index): deterministic under --seed and
never materialising a full unsharded tensor. A layer quantized at load holds a meta
placeholder (`loom.quantization.staging`): its values are drawn into a staging tensor in
the model's dtype, as they would be into the weight itself, and quantized at once.
"""

from __future__ import annotations

import torch
from torch import nn


def init_dummy_weights(model: nn.Module, seed: int, scale: float = 1e-2) -> None:
    # Listed first: a staged layer's weight is replaced (and its scale added) once drawn.
    for index, (name, param) in enumerate(list(model.named_parameters())):
        staged = getattr(param, "staged", None)
        if param.is_meta and staged is None:
            raise ValueError(f"{name}: on the meta device, with no storage to draw into")
        # (a staging tensor is dropped once quantized: no reference to it outlives the call)
        _draw(param.data if staged is None else staged.tensor(), name,
              seed * 100_003 + index, scale)
        if staged is not None:
            staged.wrote(0, param.shape[0])


def _draw(data: torch.Tensor, name: str, seed: int, scale: float) -> None:
    gen = torch.Generator(device=data.device).manual_seed(seed)
    if name.endswith("norm.weight"):
        # Norm scales near one keep activations in a realistic range.
        data.uniform_(0.9, 1.1, generator=gen)
    else:
        data.uniform_(-scale, scale, generator=gen)
