"""loom/kernels/jit_watch.py: a Triton compile after start-up is logged and counted.

CPU: the hooks called the way Triton's JITFunction calls them (keyword arguments, a
JitFunctionInfo over a real kernel, constexprs keyed by argument index), chained to hooks
that were there before. CUDA (`-m gpu`): a real compile of a fresh specialisation."""

import logging

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from triton import knobs  # noqa: E402
from triton.runtime.jit import JitFunctionInfo  # noqa: E402

from loom.kernels import jit_watch  # noqa: E402


@triton.jit
def _scale_kernel(x_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * SCALE, mask=offs < n)


@pytest.fixture
def hooks(monkeypatch):
    """Triton's two hook slots, restored after the test; interpretation off so arm() arms."""
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    monkeypatch.setattr(knobs.runtime, "interpret", False)
    monkeypatch.setattr(jit_watch, "_events", [])
    monkeypatch.setattr(jit_watch, "_previous", {})
    yield knobs.runtime


def fire(key, constants):
    """What JITFunction._do_compile passes to each hook around one compile."""
    info = JitFunctionInfo(__name__, "_scale_kernel", _scale_kernel)
    kwargs = dict(key=key, repr="_scale_kernel[...]", fn=info,
                  compile={"key": key, "constants": constants, "num_warps": 4,
                           "num_stages": 3},
                  is_manual_warmup=False, already_compiled=False)
    assert knobs.runtime.jit_cache_hook(**kwargs) is None  # None: go on and compile
    knobs.runtime.jit_post_compile_hook(**kwargs)


def test_a_compile_after_arming_is_logged_with_its_constexprs(hooks, caplog):
    assert jit_watch.arm()
    with caplog.at_level(logging.INFO, logger="loom.kernels.jit_watch"):
        fire("k1", {(2,): 3.0, (3,): 128})
    assert [name for name, _ in jit_watch.compiles()] == ["_scale_kernel"]
    assert jit_watch.compiles()[0][1] >= 0
    line = caplog.records[-1].getMessage()
    assert "_scale_kernel compiled while serving" in line
    assert "SCALE=3.0, BLOCK=128" in line and "warps=4, stages=3" in line


def test_hooks_already_installed_still_run_and_come_back(hooks):
    seen = []
    hooks.jit_cache_hook = lambda **kw: seen.append(("before", kw["key"]))
    hooks.jit_post_compile_hook = lambda **kw: seen.append(("after", kw["key"]))
    earlier = (hooks.jit_cache_hook, hooks.jit_post_compile_hook)
    assert jit_watch.arm() and jit_watch.arm()  # twice: still one link each
    fire("k2", {(3,): 64})
    assert seen == [("before", "k2"), ("after", "k2")]
    jit_watch.disarm()
    assert (hooks.jit_cache_hook, hooks.jit_post_compile_hook) == earlier


def test_nothing_to_watch_under_the_interpreter(hooks, monkeypatch):
    monkeypatch.setattr(knobs.runtime, "interpret", True)
    assert not jit_watch.arm()
    assert hooks.jit_cache_hook is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and compiled Triton")
def test_a_real_compile_is_seen_once(hooks, caplog):
    x = torch.ones(100, device="cuda")
    _scale_kernel[(1,)](x, 100, SCALE=2.0, BLOCK=128)  # compiled before arming: not counted
    jit_watch.arm()
    with caplog.at_level(logging.INFO, logger="loom.kernels.jit_watch"):
        _scale_kernel[(1,)](x, 100, SCALE=2.0, BLOCK=128)  # cached: no compile
        _scale_kernel[(1,)](x, 100, SCALE=0.5, BLOCK=128)  # a new constexpr: one compile
    torch.cuda.synchronize()
    assert [name for name, _ in jit_watch.compiles()] == ["_scale_kernel"]
    assert "SCALE=0.5" in caplog.text
    assert torch.equal(x, torch.full((100,), 2.0, device="cuda"))  # x 2, x 2, x 0.5
    jit_watch.disarm()
