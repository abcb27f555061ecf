"""Per-layer host time against GPU time for an eagerly run step (LOOM_LAYER_TIMES=1).

Each attention call marks the host clock and records a CUDA event on the stream; the end of
the forward marks once more. Host time per layer is the gap between consecutive marks on
the host; GPU time per layer the gap between the events. Where the host takes as long per
layer as the GPU, the GPU is waiting for launches (host-bound); where it takes less, the
host runs ahead and the GPU's own time is the step's. A profiler answers the same question
but adds its own host cost to every launch, which is what is being measured here.
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

logger = logging.getLogger(__name__)


class LayerClock:
    def __init__(self, num_tokens: int) -> None:
        self.num_tokens = num_tokens
        self.host: list[float] = []
        self.events: list[torch.cuda.Event] = []

    def mark(self) -> None:
        self.host.append(time.perf_counter())
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events.append(event)

    def report(self) -> str | None:
        """The summary line, once the last event has completed (waits for it)."""
        if len(self.events) < 3:
            return None
        self.events[-1].synchronize()
        gpu_ms = [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])]
        host_ms = [(b - a) * 1e3 for a, b in zip(self.host, self.host[1:])]
        return summarize(self.num_tokens, host_ms, gpu_ms)


def summarize(num_tokens: int, host_ms: list[float], gpu_ms: list[float]) -> str:
    """One line: medians per layer, the spans, and which side bounds the step."""
    host, gpu = statistics.median(host_ms), statistics.median(gpu_ms)
    bound = "the host (the GPU waits for launches)" if host >= 0.9 * gpu else "the GPU"
    return (f"layer times: {num_tokens} tokens, {len(gpu_ms)} layers: host {host:.3f} ms, GPU "
            f"{gpu:.3f} ms per layer (medians); first attention to the end: host "
            f"{sum(host_ms):.1f} ms, GPU {sum(gpu_ms):.1f} ms; bound by {bound}")
