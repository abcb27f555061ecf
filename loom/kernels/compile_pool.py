"""Compile Triton kernels on several threads at once.

Inside `compile_pool()`, each `kernel.warmup(...)` (a compile without a launch) is handed to
a thread pool through Triton's AsyncCompileMode, and the block's end waits for them all.
Compiling is mostly LLVM and ptxas, outside the GIL, so N kernels take ~N/threads the time.
A real launch inside the block still compiles in line: it waits for its own kernel. Used by
start-up's warm-ups and by the MoE tuner.
"""

from __future__ import annotations

import contextlib
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

from loom.kernels.launch import fast_launch


@contextlib.contextmanager
def compile_pool(max_threads: int = 8, ignore_errors: bool = False) -> Iterator[int]:
    """Yields the number of compile threads; 0 where this Triton has no AsyncCompileMode
    (each compile then runs in line, as before). ignore_errors: a failed compile is dropped
    (its kernel compiles again, and fails visibly, at its first launch) instead of raised
    at the block's end."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        yield 0
        return
    threads = max(1, min(max_threads, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=threads) as pool, \
            AsyncCompileMode(pool, ignore_errors=ignore_errors):
        yield threads


def launch_or_compile(kernel, grid: tuple[int, ...], compile_only: bool):
    """kernel[grid] (by `fast_launch`), or with compile_only its compile alone (Triton's warmup: inside
    compile_pool, handed to a thread; nothing runs), to be called with the launch's args."""
    if compile_only:
        return functools.partial(kernel.warmup, grid=grid)
    return fast_launch(kernel, grid)
