"""Pinned host buffers for the engine's module-wide rings, and the one-copy upload of a
step's host arrays through them."""

from __future__ import annotations

import numpy as np
import torch


def pinned_empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised host tensor, pinned where CUDA is present. Always a normal tensor,
    even when made inside `torch.inference_mode`: the rings holding these buffers live as
    long as the process and serve callers in and out of inference mode, and an inference
    tensor refuses in-place writes outside it (the Triton backend, run outside inference
    mode after an engine had stepped in the same process, failed so on an H200: run_zzz80)."""
    with torch.inference_mode(False):
        return torch.empty(numel, dtype=dtype, pin_memory=torch.cuda.is_available())


class PinnedRing:
    """Pinned host buffers of one dtype, handed out in turn. A buffer is handed out again
    only after the copy recorded against it (`copied`) len(buffers) turns ago has finished;
    callers size the ring so that this copy preceded the oldest step still on the device,
    and the wait is free. (Pinning a fresh buffer every step cost milliseconds.)"""

    def __init__(self, size: int, dtype: torch.dtype, min_numel: int = 1024) -> None:
        self._buffers: list[torch.Tensor | None] = [None] * size
        self._events: list[torch.cuda.Event | None] = [None] * size
        self._dtype, self._min_numel, self._turn = dtype, min_numel, 0

    def take(self, numel: int) -> torch.Tensor:
        """The next buffer's first `numel` entries (the buffer grows, at least doubling)."""
        self._turn = (self._turn + 1) % len(self._buffers)
        event, buf = self._events[self._turn], self._buffers[self._turn]
        if event is not None:
            event.synchronize()
            self._events[self._turn] = None
        if buf is None or buf.numel() < numel:
            old = buf.numel() if buf is not None else 0
            buf = pinned_empty(max(numel, 2 * old, self._min_numel), self._dtype)
            self._buffers[self._turn] = buf
        return buf[:numel]

    def copied(self) -> None:
        """Record, on the current stream, that the buffer last taken is being copied from."""
        event = torch.cuda.Event()
        event.record()
        self._events[self._turn] = event


_ALIGN = 256
"""Bytes each uploaded array starts on, like a tensor of its own: Triton compiles a kernel
variant per pointer alignment (a step with a new mix would recompile), and Inductor copies
graph inputs that are less aligned than its example inputs."""
_TORCH_DTYPES = {np.int64: torch.int64, np.int32: torch.int32}
_STAGING = PinnedRing(8, torch.uint8, min_numel=1 << 16)
"""Shared by a step's input upload, its mixed-step index upload and a draft model's (one a
step): at two uploads a step and at most three steps in flight, or three for a draft
model's step (never beside another), the copy eight uploads back preceded the oldest of
them."""


def upload(arrays: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Host int32/int64 arrays as device tensors: on CUDA, packed into one pinned staging
    buffer, one non-blocking copy, then viewed back (no kernel, no wait on the stream)."""
    if device.type != "cuda":
        return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // _ALIGN) * _ALIGN
    host = _STAGING.take(max(total, _ALIGN))
    buf = host.numpy()
    for a, o in zip(arrays, offsets):
        buf[o:o + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
    dev = torch.empty(host.shape, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)
    _STAGING.copied()
    return [dev[o:o + a.nbytes].view(_TORCH_DTYPES[a.dtype.type]).view(a.shape)
            for a, o in zip(arrays, offsets)]
