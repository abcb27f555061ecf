"""Where loom's measured kernel tables live (loom/kernels/configs/, or LOOM_MOE_CONFIG_DIR)
and the device name their file names carry: the fused MoE's tiles (moe_config.py) and the
decode GEMV's (gemv_decode.py)."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
"""Where tuned tables live; LOOM_MOE_CONFIG_DIR, when set, takes its place (for every table:
the name predates the GEMV's)."""


def config_dir() -> Path:
    root = os.environ.get("LOOM_MOE_CONFIG_DIR")
    return Path(root) if root else CONFIG_DIR


@functools.cache
def device_name(device: torch.device) -> str:
    """The name in a config file's name: torch.cuda.get_device_name with spaces as
    underscores (NVIDIA_H200), or the device type off CUDA (cpu)."""
    if device.type != "cuda":
        return device.type
    return torch.cuda.get_device_name(device).replace(" ", "_")
