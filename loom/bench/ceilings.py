"""The device's ceilings, measured in the same run as the benchmark they judge: a
device-to-device copy (memory bandwidth, read + write bytes counted) and a bf16 8192^3 matmul
(tensor-core rate). Absolute times move between machines; ratios to these do not.

Each ceiling is the best of several timed trials: a ceiling is the rate the device can
reach, and one 50-call timing of the matmul ranged 736-800 TFLOP/s between processes on the
same H200, which moved a prefill's fraction of it by 7 points (benchmarks/results/
h200-tp1-prefill8192-piecewise-6528cc9/).

The offline benchmarks also hold the matmul for a few seconds and report the rate it
settles at: an H200 at its power limit lowers its clocks within a second of sustained
tensor-core work (8192^3 held 20 s: 680 TFLOP/s at ~1500 MHz and ~690 W, against a burst
rate of 807, `benchmarks/gpu/gemm_probe.py`), and a 40-s throughput run or back-to-back
prefills are held work. The floors keep the burst rate; the held one is printed beside."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

COPY_BYTES = 1 << 30
MATMUL_N = 8192


@dataclass(frozen=True)
class Ceilings:
    device: str
    copy_tb_per_s: float
    """Bytes read + bytes written per second by `dst.copy_(src)`, in TB/s (1e12)."""
    matmul_tflop_per_s: float
    """bf16 (MATMUL_N x MATMUL_N) @ (MATMUL_N x MATMUL_N), 2 N^3 FLOPs each, in TFLOP/s."""
    matmul_n: int = MATMUL_N
    copy_bytes: int = COPY_BYTES
    matmul_held_tflop_per_s: float | None = None
    """The same matmul back to back for matmul_held_s: its rate over the last third."""
    matmul_held_s: float | None = None
    fp8_matmul_tflop_per_s: float | None = None
    """With fp8 layers: the same shape as loom's fp8 layers run it (`torch._scaled_mm`,
    float8_e4m3fn in, row-wise scales, bf16 out)."""
    int8_matmul_tops: float | None = None
    """With int8 W8A8 layers: cuBLAS's int8 GEMM of the same shape (`torch._int_mm`, int32
    out), in tera-ops per second."""

    def matmul_rate(self, fp8: bool) -> float:
        """The rate compute floors are held to: the 8-bit GEMM's measured (fp8's, or int8's
        for int8 layers) for 8-bit layers, else bf16's."""
        return (fp8 and (self.fp8_matmul_tflop_per_s or self.int8_matmul_tops)) or \
            self.matmul_tflop_per_s


TRIALS = 5


def _time_cuda(fn: Callable[[], None], device: torch.device, warmup: int, iters: int) -> float:
    """Seconds per call, timed with CUDA events around `iters` back-to-back calls."""
    for _ in range(warmup):
        fn()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 1e3 / iters


def _best_seconds(fn: Callable[[], None], device: torch.device, warmup: int, iters: int,
                  trials: int = TRIALS) -> float:
    """The fastest of `trials` timings of `iters` calls each, after one warm-up."""
    best = _time_cuda(fn, device, warmup=warmup, iters=iters)
    for _ in range(trials - 1):
        best = min(best, _time_cuda(fn, device, warmup=0, iters=iters))
    return best


def copy_bandwidth_tbps(device: torch.device, nbytes: int = COPY_BYTES, iters: int = 20) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    seconds = _best_seconds(lambda: dst.copy_(src), device, warmup=5, iters=iters)
    return 2 * nbytes / seconds / 1e12


def _matmul(device: torch.device, n: int) -> Callable[[], None]:
    """One bf16 (n x n) @ (n x n) into a preallocated output, as a call."""
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    out = torch.empty(n, n, dtype=torch.bfloat16, device=device)
    return lambda: torch.mm(a, b, out=out)


def matmul_tflops(device: torch.device, n: int = MATMUL_N, iters: int = 20) -> float:
    seconds = _best_seconds(_matmul(device, n), device, warmup=10, iters=iters)
    return 2 * n ** 3 / seconds / 1e12


def fp8_matmul_tflops(device: torch.device, n: int = MATMUL_N, iters: int = 20) -> float:
    a = torch.randn(n, n, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=device).to(torch.float8_e4m3fn).t()  # column-major
    scale_a = torch.ones(n, 1, device=device)
    scale_b = torch.ones(1, n, device=device)
    seconds = _best_seconds(lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b,
                                                     out_dtype=torch.bfloat16),
                            device, warmup=10, iters=iters)
    return 2 * n ** 3 / seconds / 1e12


def int8_matmul_tops(device: torch.device, n: int = MATMUL_N, iters: int = 20) -> float:
    a = torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device)
    b = torch.randint(-128, 128, (n, n), dtype=torch.int8, device=device).t()  # column-major
    seconds = _best_seconds(lambda: torch._int_mm(a, b), device, warmup=10, iters=iters)
    return 2 * n ** 3 / seconds / 1e12


def held_matmul_tflops(device: torch.device, seconds: float, n: int = MATMUL_N) -> float:
    """The matmul back to back for `seconds`; its rate over the last third (the clocks
    settle within the first second)."""
    mm = _matmul(device, n)
    calls = max(1, int(seconds / 3 / _time_cuda(mm, device, warmup=3, iters=10)))
    _time_cuda(mm, device, warmup=0, iters=2 * calls)  # the first two thirds: clocks settle
    return 2 * n ** 3 / _time_cuda(mm, device, warmup=0, iters=calls) / 1e12


def measure_ceilings(device: torch.device, held_s: float = 0.0,
                     fp8: bool = False, int8: bool = False) -> Ceilings | None:
    """Both ceilings on a CUDA device (and, with held_s, the matmul's held rate; with fp8,
    the fp8 matmul's rate; with int8, the int8 GEMM's); None (and a log line saying so) on
    CPU."""
    if device.type != "cuda":
        logger.info("ceilings: skipped on %s (measured on CUDA devices only)", device)
        return None
    copy = copy_bandwidth_tbps(device)
    rate = matmul_tflops(device)
    held = held_matmul_tflops(device, held_s) if held_s > 0 else None
    fp8_rate = fp8_matmul_tflops(device) if fp8 else None
    int8_rate = int8_matmul_tops(device) if int8 else None
    torch.cuda.empty_cache()
    ceilings = Ceilings(torch.cuda.get_device_name(device), copy, rate,
                        matmul_held_tflop_per_s=held, matmul_held_s=held_s or None,
                        fp8_matmul_tflop_per_s=fp8_rate, int8_matmul_tops=int8_rate)
    logger.info("ceilings on %s: copy %.2f TB/s (read+write), bf16 matmul %.0f TFLOP/s%s%s%s",
                ceilings.device, copy, rate,
                f" (held {held_s:.0f} s: {held:.0f})" if held is not None else "",
                f", fp8 matmul {fp8_rate:.0f} TFLOP/s" if fp8_rate is not None else "",
                f", int8 GEMM {int8_rate:.0f} TOPS" if int8_rate is not None else "")
    return ceilings


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
