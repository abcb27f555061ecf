"""Pinned host buffers for the engine's module-wide rings (index uploads, token read-backs,
input staging)."""

from __future__ import annotations

import torch


def pinned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised host tensor, pinned where CUDA is present. Always a normal tensor,
    even when made inside `torch.inference_mode`: the rings holding these buffers live as
    long as the process and serve callers in and out of inference mode, and an inference
    tensor refuses in-place writes outside it (the Triton backend, run outside inference
    mode after an engine had stepped in the same process, failed so on an H200: run_zzz80)."""
    with torch.inference_mode(False):
        return torch.empty(numel, dtype=dtype, pin_memory=torch.cuda.is_available())
