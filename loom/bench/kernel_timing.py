"""Timing one kernel call, as `loom bench moe` and `loom bench attention` do.

On a GPU: warm-up calls (they compile), then the call captured in a CUDA graph and replayed,
each replay timed by CUDA events after FLUSH_BYTES are written (the model's other layers
evict the weights and caches between two calls of one kernel); the median. On the CPU
(Triton's interpreter): perf_counter around plain calls. Also the two helpers both benches
check kernels with: clocks spun up before timing, fresh tensors poisoned with NaN.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

FLUSH_BYTES = 256 << 20
"""Written before every timed replay: several times the H200's 60 MB of L2."""


def median(values: list[float]) -> float:
    values = sorted(values)
    return values[len(values) // 2]


@contextlib.contextmanager
def nan_fresh_tensors() -> Iterator[None]:
    """Fresh float tensors (outputs, scratch) start as NaN meanwhile, so that a row no
    kernel writes cannot pass a check on stale memory."""
    import torch
    real_empty, real_empty_like = torch.empty, torch.empty_like

    def poison(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    torch.empty = lambda *a, **kw: poison(real_empty(*a, **kw))
    torch.empty_like = lambda *a, **kw: poison(real_empty_like(*a, **kw))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = real_empty, real_empty_like


class KernelTimer:
    """Median microseconds of a call on `device`. fall_back_to_launches: where CUDA graph
    capture fails, time plain launches (and say so) rather than raise."""

    def __init__(self, device, warmup: int, iters: int,
                 fall_back_to_launches: bool = False) -> None:
        import torch
        self.torch, self.device, self.warmup, self.iters = torch, device, warmup, iters
        self.cuda = device.type == "cuda"
        self.fall_back = fall_back_to_launches
        self.flush = (torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device)
                      if self.cuda else None)
        self.method = "cuda_graph" if self.cuda else "perf_counter"
        """How the last call was timed: cuda_graph, launches (capture failed) or
        perf_counter."""

    def spin(self, seconds: float = 0.2) -> None:
        """Busy the GPU a moment so that its clocks are up before anything is timed (an
        idle H200 drops to a few hundred MHz, which would favour later calls)."""
        if not self.cuda:
            return
        torch = self.torch
        a = torch.randn(4096, 4096, device=self.device, dtype=torch.bfloat16)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(10):
                a @ a
            torch.cuda.synchronize(self.device)

    def time_us(self, fn: Callable[[], Any], iters: int | None = None,
                budget_s: float | None = None) -> float:
        """Median us of fn. budget_s (GPU): as many replays as fit in it, at least 3 and at
        most iters (a search's first pass over many configs)."""
        iters = iters or self.iters
        for _ in range(max(1, self.warmup) if self.cuda else self.warmup):
            fn()  # compiles before any capture
        if not self.cuda:
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e6)
            return median(times)
        self.torch.cuda.synchronize(self.device)
        graph = self._capture(fn)
        self.method = "cuda_graph" if graph is not None else "launches"
        launch = graph.replay if graph is not None else fn
        try:
            if budget_s is not None:
                first = self._replays(launch, 1)[0]
                iters = max(3, min(iters, int(budget_s * 1e6 / max(first, 1.0))))
            return median(self._replays(launch, iters))
        finally:
            del graph

    def _replays(self, launch: Callable[[], Any], n: int) -> list[float]:
        torch = self.torch
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(n)]
        for start, end in events:
            self.flush.zero_()
            start.record()
            launch()
            end.record()
        torch.cuda.synchronize(self.device)
        return [start.elapsed_time(end) * 1e3 for start, end in events]

    def _capture(self, fn: Callable[[], Any]):
        """A CUDA graph of fn; None (time plain launches) where capture fails and the timer
        falls back."""
        torch = self.torch
        # Earlier calls' graphs are gone, but their private pools stay reserved until the
        # cache is emptied, and the allocator cannot empty it during a capture: at
        # `loom bench moe --tune` M=16384 on an 80 GB H100 the finalists' captures ran out
        # of memory behind ~100 dead graphs (h100-session54-zzz131).
        torch.cuda.empty_cache()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin()
                try:
                    fn()
                finally:
                    graph.capture_end()
        except RuntimeError as e:
            if not self.fall_back:
                raise
            logger.warning("CUDA graph capture failed (%s); timing plain launches",
                           str(e).splitlines()[0] if str(e) else type(e).__name__)
            torch.cuda.synchronize(self.device)
            return None
        finally:
            torch.cuda.current_stream(self.device).wait_stream(stream)
        return graph
