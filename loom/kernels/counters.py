"""Zeroed int32 arrival counters for kernels whose last program to finish a unit of work
combines the others' partials (a "fixup": the GEMV's split-K, decode attention's splits).

Each kernel family has its own buffer per device, made by its first call, which must not be
inside a CUDA graph capture (warm-up runs eagerly first), and reused: the last program of
each unit sets its counter back to 0. So two launches of one family must not run
concurrently on different streams of a device.
"""

from __future__ import annotations

import torch

SIZE = 1 << 16
"""Counters per family and device."""

_BUFFERS: dict[tuple[str, torch.device], torch.Tensor] = {}


def counters(family: str, device: torch.device, needed: int) -> torch.Tensor:
    """The family's zeroed buffer on device; ValueError if `needed` exceed its SIZE."""
    if needed > SIZE:
        raise ValueError(f"{family}: {needed} fixup counters needed, {SIZE} available")
    buf = _BUFFERS.get((family, device))
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{family}: the first fixup call on a device must run outside "
                               "CUDA graph capture (it allocates the counters)")
        buf = _BUFFERS[(family, device)] = torch.zeros(SIZE, dtype=torch.int32, device=device)
    return buf
