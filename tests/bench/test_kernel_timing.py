"""The kernel timer's CPU path and the NaN poisoning both kernel benches check with."""

import time

import torch

from loom.bench.kernel_timing import KernelTimer, median, nan_fresh_tensors


def test_cpu_timing_is_the_median_of_plain_calls():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002)
    timer = KernelTimer(torch.device("cpu"), warmup=1, iters=5)
    us = timer.time_us(fn)
    assert len(calls) == 1 + 5 and timer.method == "perf_counter"
    assert 1500 < us < 200_000
    assert len(calls) == 6 and timer.time_us(fn, iters=3) > 0 and len(calls) == 6 + 1 + 3


def test_fresh_float_tensors_are_nan_meanwhile_only():
    real = torch.empty, torch.empty_like
    with nan_fresh_tensors():
        assert torch.empty(3).isnan().all() and torch.empty_like(torch.ones(2)).isnan().all()
        assert torch.empty(3, dtype=torch.int32).dtype == torch.int32  # ints untouched
    assert (torch.empty, torch.empty_like) == real
    assert median([3.0, 1.0, 2.0]) == 2.0


def test_dead_graphs_memory_is_freed_before_each_capture():
    """A capture cannot free the cached memory of earlier graphs' pools, so the timer empties
    the cache before it begins one (else a tuner's hundredth capture runs out of memory)."""
    calls = []

    class Graph:
        def capture_begin(self):
            calls.append("capture_begin")

        def capture_end(self):
            calls.append("capture_end")

    class Stream:
        def wait_stream(self, other):
            pass

    class Cuda:
        CUDAGraph, Stream = Graph, staticmethod(lambda device: Stream())

        @staticmethod
        def empty_cache():
            calls.append("empty_cache")

        @staticmethod
        def stream(s):
            import contextlib
            return contextlib.nullcontext()

        @staticmethod
        def current_stream(device):
            return Stream()

    timer = KernelTimer(torch.device("cpu"), warmup=1, iters=1)
    timer.torch = type("FakeTorch", (), {"cuda": Cuda})
    assert timer._capture(lambda: calls.append("fn")) is not None
    assert calls == ["empty_cache", "capture_begin", "fn", "capture_end"]
