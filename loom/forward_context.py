"""The one scoped channel from the model runner to the attention layers.

`with forward_context(ctx): model(...)` makes `ctx` visible to every attention op for the
duration of that forward and restores the previous value after, even on error.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from loom.attention.backend import AttentionBackend, AttentionMetadata


@dataclass
class ForwardContext:
    attn_metadata: AttentionMetadata | None
    """None during a profiling or compile-warm-up run: attention writes and reads nothing."""
    kv_caches: list[torch.Tensor]
    backend: AttentionBackend
    layer_clock: Any = None
    """A `loom.worker.layer_clock.LayerClock` that each attention call marks
    (LOOM_LAYER_TIMES=1), or None."""


_current: ForwardContext | None = None


@contextlib.contextmanager
def forward_context(ctx: ForwardContext):
    global _current
    previous, _current = _current, ctx
    try:
        yield ctx
    finally:
        _current = previous


def get_forward_context() -> ForwardContext:
    if _current is None:
        raise RuntimeError("attention ran outside `with forward_context(...)`")
    return _current
