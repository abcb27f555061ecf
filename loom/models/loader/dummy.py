"""Random weights for benchmarking large architectures without their checkpoints.

Each parameter is filled where it lives (on its device, in its dtype, this rank's shard
only), from a generator seeded by (seed, parameter index): deterministic under --seed and
never materialising a full unsharded tensor.
"""

from __future__ import annotations

import torch
from torch import nn


def init_dummy_weights(model: nn.Module, seed: int, scale: float = 1e-2) -> None:
    for index, (name, param) in enumerate(model.named_parameters()):
        gen = torch.Generator(device=param.device).manual_seed(seed * 100_003 + index)
        if name.endswith("norm.weight"):
            # Norm scales near one keep activations in a realistic range.
            param.data.uniform_(0.9, 1.1, generator=gen)
        else:
            param.data.uniform_(-scale, scale, generator=gen)
