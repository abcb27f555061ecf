"""Say when a Triton kernel compiles while the engine serves.

Start-up compiles what it can foresee (the compile run at the largest batch, the warm-up's
step shapes, CUDA-graph capture). A kernel first launched with new constexprs after that
compiles in the middle of a step: every request in flight waits for it (hundreds of
milliseconds to seconds each). Once armed, each such compile logs one line naming the kernel,
its constexprs and the time it took, so that the warm-up can be taught the shape, and
`compiles()` counts them for the benchmarks.

Triton's own hooks (`triton.knobs.runtime.jit_cache_hook`, called before a compile, and
`jit_post_compile_hook`, after) carry the events; hooks already installed are chained.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_started: dict[Any, float] = {}
_events: list[tuple[str, float]] = []
_previous: dict[str, Any] = {}


def arm() -> bool:
    """Watch every Triton JIT compile from now on (idempotent). False where Triton is
    missing or interprets kernels (nothing compiles there)."""
    try:
        from triton import knobs
    except ImportError:
        return False
    if knobs.runtime.interpret:
        return False
    rt = knobs.runtime
    if rt.jit_cache_hook is not _before:
        _previous["before"], rt.jit_cache_hook = rt.jit_cache_hook, _before
    if rt.jit_post_compile_hook is not _after:
        _previous["after"], rt.jit_post_compile_hook = rt.jit_post_compile_hook, _after
    return True


def disarm() -> None:
    """Put back the hooks that were there before arm()."""
    from triton import knobs
    rt = knobs.runtime
    if rt.jit_cache_hook is _before:
        rt.jit_cache_hook = _previous.pop("before", None)
    if rt.jit_post_compile_hook is _after:
        rt.jit_post_compile_hook = _previous.pop("after", None)


def compiles() -> list[tuple[str, float]]:
    """(kernel name, seconds) of every compile seen since arm(), oldest first."""
    with _lock:
        return list(_events)


def constexprs(fn, constants: dict) -> str:
    """The compile's constexpr arguments as name=value, in the kernel's argument order."""
    names = fn.jit_function.arg_names
    pairs = sorted((key[0], value) for key, value in constants.items() if len(key) == 1)
    return ", ".join(f"{names[i]}={v}" for i, v in pairs if i < len(names))


def _before(**kwargs) -> bool | None:
    with _lock:
        _started[kwargs["key"]] = time.perf_counter()
    chained = _previous.get("before")
    return chained(**kwargs) if chained is not None else None


def _after(**kwargs) -> bool | None:
    now = time.perf_counter()
    fn, compile_info = kwargs["fn"], kwargs["compile"]
    with _lock:
        seconds = now - _started.pop(kwargs["key"], now)
        _events.append((fn.name, seconds))
    logger.info("triton: %s compiled while serving, %.2f s (warps=%d, stages=%d; %s): a "
                "launch shape start-up did not warm up", fn.name, seconds,
                compile_info["num_warps"], compile_info["num_stages"],
                constexprs(fn, compile_info["constants"]))
    chained = _previous.get("after")
    return chained(**kwargs) if chained is not None else None
