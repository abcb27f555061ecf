"""Arrival counters for kernels whose programs split one output and let the last one to
finish combine the parts (a "fixup", as CUTLASS's stream-K semaphores): each program stores
its part, bumps its output's counter with acquire-release semantics, and the program that
sees the count reach the number of parts sums them and puts the counter back to 0.

One zeroed int32 buffer per (device, kernel family), made by the first call and reused, so
the counters survive CUDA graph capture and replay. Two launches of one family must not
run at once on different streams (they would share counters); one stream is the rule.
"""

from __future__ import annotations

import torch

SIZE = 1 << 16
"""Counters per (device, family): outputs one launch may split."""

_BUFFERS: dict[tuple[torch.device, str], torch.Tensor] = {}


def counters(device: torch.device, needed: int, family: str) -> torch.Tensor:
    """The zeroed counters of `family` on `device` (at least `needed` of them)."""
    if needed > SIZE:
        raise ValueError(f"{family}: {needed} split outputs exceed the {SIZE} arrival "
                         "counters")
    key = (device, family)
    buf = _BUFFERS.get(key)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{family}: the first call on a device must run outside CUDA "
                               "graph capture (it allocates the arrival counters)")
        # A normal tensor even if the first call is inside inference mode: the counters
        # outlive it, and an inference tensor refuses in-place writes outside it.
        with torch.inference_mode(False):
            buf = _BUFFERS[key] = torch.zeros(SIZE, dtype=torch.int32, device=device)
    return buf
