"""Triton launches with less host work per call, for kernels launched outside CUDA graphs.

`kernel[grid](*args)` costs Triton's `JITFunction.run` a binding of every argument (its
specialization: dtypes, 16-byte alignment, integers equal to 1 or divisible by 16), a cache
key built from `str()` of the options, a check that no global the kernel read has changed,
launch metadata for the launch hooks (chains, empty unless a profiler filled them), then the
C launcher, which calls those hooks. For the split-K decode kernel's 53 arguments that was
56-63 us of host time a call on the H200 host, against 21-23 us for the binding alone and
13-15 us for the launcher (run_zzz66, run_zzz67), where a layer of an eager decode or of a
prompt step between piece graphs makes one or two such launches.

`fast_launch(kernel, grid)(*args)` keeps Triton's own binding, so the specialization is
exactly the one Triton would compute, and from the second call of a specialization goes
straight to the compiled kernel's launcher, keyed by that specialization and the options.
The first call of each goes through `kernel[grid]` (which compiles it). Where a launch hook
is set (a profiler), the kernel has pre-run hooks or this is not a compiled GPU kernel
(the CPU interpreter), every call takes `kernel[grid]`; and so does every call with
LOOM_FAST_LAUNCH=0. Run_zzz70 ran the GPU tests with it (specializations against torch, CUDA
graphs, the tiny models against the CPU) and measured 5-8 us a launch less than Triton's
path (0.88x-0.89x of a 1-row add + norm, the split-K decode kernel, the rope + KV write).

It skips Triton's check that globals a kernel read are unchanged, which guards against
editing a module's constants after a compile: loom never does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from loom import envs

try:  # Triton's internals as of 3.6; without them every launch is kernel[grid]
    from triton import knobs
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction
except ImportError:  # pragma: no cover - an older or newer Triton
    JITFunction = None

_launchers: dict[tuple[int, int], dict[tuple, Any]] = {}
"""(id(kernel), device) -> {(specialization, options): the compiled kernel}."""


def fast_launch(kernel, grid: tuple[int, ...]) -> Callable[..., Any]:
    """What `kernel[grid]` returns: a function of the launch's arguments."""
    if JITFunction is None or not isinstance(kernel, JITFunction) or not envs.fast_launch():
        return kernel[grid]
    return lambda *args, **kwargs: _launch(kernel, grid, args, kwargs)


def _hooked(hook) -> bool:
    """Whether a launch hook would do anything: Triton 3.6's are chains, empty unless a
    profiler added to them (JITFunction.run still builds each launch's metadata for them)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _launch(kernel, grid: tuple[int, ...], args: tuple, kwargs: dict) -> Any:
    if kernel.pre_run_hooks or _hooked(knobs.runtime.launch_enter_hook) \
            or _hooked(knobs.runtime.launch_exit_hook):
        return kernel[grid](*args, **kwargs)
    device = driver.active.get_current_device()
    caches = kernel.device_caches[device]  # made on first use, as JITFunction.run does
    # As JITFunction.run: these two are options of the compiled kernel.
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound, specialization, options = caches[4](*args, **kwargs)
    try:
        key = (tuple(specialization), tuple(options.items()))
        table = _launchers.setdefault((id(kernel), device), {})
        compiled = table.get(key)
    except TypeError:  # an unhashable option: no fast path for it
        return kernel[grid](*args, **kwargs)
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)
        if compiled is not None and not hasattr(compiled, "result"):  # not a pending compile
            table[key] = compiled
        return compiled
    stream = driver.active.get_current_stream(device)
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                 stream, compiled.function, compiled.packed_metadata, None, None, None,
                 *bound.values())
    return compiled
