"""What a model runner takes from its device before it builds anything: the attention
backend, and the config's device-chosen defaults (batch limits, compile level)."""

from __future__ import annotations

import dataclasses
import logging

import torch

from loom.attention.backend import AttentionBackend
from loom.config import EngineConfig

logger = logging.getLogger(__name__)


def select_backend(device: torch.device) -> AttentionBackend:
    if device.type == "cuda":
        try:
            from loom.attention.triton_backend import TritonBackend
            return TritonBackend()
        except ImportError as e:
            logger.warning("Triton attention unavailable (%s); using the torch-native backend", e)
    from loom.attention.torch_native import TorchNativeBackend
    return TorchNativeBackend()


def resolved_for_device(config: EngineConfig, device: torch.device) -> EngineConfig:
    """config with what was left to the device filled in for this one, as vLLM picks it:
    the batch limits (SchedulerConfig.resolved) and the compile level (CompilationConfig.
    resolved). Fields already set stay."""
    if device.type == "cuda":
        scheduler = config.scheduler.resolved(torch.cuda.get_device_name(device),
                                              torch.cuda.get_device_properties(device).total_memory)
    else:
        scheduler = config.scheduler.resolved(None, 0)
    return dataclasses.replace(config, scheduler=scheduler,
                               compilation=config.compilation.resolved(device.type,
                                                                         scheduler.max_num_seqs))
