"""loom.kernels.launch.fast_launch: Triton's own binding of the arguments, then the compiled
kernel's launcher directly from the second call of a specialization. On the GPU every
specialization Triton distinguishes (an integer equal to 1 or not a multiple of 16, a pointer
off 16-byte alignment, another dtype, a constexpr) launches its own compiled kernel, checked
against torch; on the CPU (the interpreter) and with LOOM_FAST_LAUNCH=0, it is kernel[grid]."""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from loom.kernels import launch  # noqa: E402


@triton.jit
def _scaled_copy(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=ok) * scale, mask=ok)


def _slow_calls(monkeypatch, kernel) -> list:
    """Record each launch that goes through Triton's JITFunction.run."""
    calls = []
    run = kernel.run

    def counting(*args, **kwargs):
        calls.append(args)
        return run(*args, **kwargs)
    monkeypatch.setattr(kernel, "run", counting)
    return calls


def test_without_a_compiled_gpu_kernel_it_is_triton_s_own_launch(monkeypatch):
    calls = _slow_calls(monkeypatch, _scaled_copy)
    x = torch.arange(40, dtype=torch.float32, device="cuda" if torch.cuda.is_available()
                     else "cpu")
    y = torch.empty_like(x)
    monkeypatch.setenv("LOOM_FAST_LAUNCH", "0")
    for _ in range(2):
        launch.fast_launch(_scaled_copy, (3,))(x, y, 40, 2.0, BLOCK=16)
        torch.testing.assert_close(y, 2 * x)
    assert len(calls) == 2
    if torch.cuda.is_available():
        return
    monkeypatch.setenv("LOOM_FAST_LAUNCH", "1")  # the interpreter: every call is Triton's
    launch.fast_launch(_scaled_copy, (3,))(x, y, 40, 3.0, BLOCK=16)
    torch.testing.assert_close(y, 3 * x)
    assert len(calls) == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_each_specialization_launches_its_own_kernel(monkeypatch):
    monkeypatch.setenv("LOOM_FAST_LAUNCH", "1")
    calls = _slow_calls(monkeypatch, _scaled_copy)
    base = torch.randn(4096, device="cuda")
    half = base.to(torch.float16)
    cases = [  # (x, n, BLOCK): each a specialization the ones before it are not
        (base, 4096, 256),
        (base, 1, 256),        # n == 1: a constexpr in the compiled kernel
        (base, 1000, 256),     # n not a multiple of 16
        (base[1:], 4095, 256),  # x off 16-byte alignment
        (half, 4096, 256),     # another dtype
        (base, 4096, 128),     # another constexpr
    ]
    for round_ in range(3):
        for x, n, block in cases:
            y = torch.full_like(x, float("nan"))
            scale = 0.5 + round_  # a float: never specialized
            launch.fast_launch(_scaled_copy, (triton.cdiv(n, block),))(x, y, n, scale,
                                                                         BLOCK=block)
            torch.testing.assert_close(y[:n], x[:n] * scale)
            assert torch.isnan(y[n:]).all()
        # Round 0 compiles each through Triton; later rounds launch them directly.
        assert len(calls) == len(cases)
    device = torch.cuda.current_device()
    assert len(launch._launchers[(id(_scaled_copy), device)]) == len(cases)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_graph_replays_what_it_captured_through_the_fast_path(monkeypatch):
    monkeypatch.setenv("LOOM_FAST_LAUNCH", "1")
    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    fast = launch.fast_launch(_scaled_copy, (4,))
    for _ in range(2):
        fast(x, y, 1024, 2.0, BLOCK=256)  # compiled, then cached
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fast(x, y, 1024, 3.0, BLOCK=256)
    x.copy_(torch.randn_like(x))
    y.zero_()
    graph.replay()
    torch.testing.assert_close(y, 3 * x)


def test_a_launch_hook_with_calls_in_it_keeps_triton_s_path():
    """Triton 3.6's launch hooks are chains, present and empty by default: only a chain with
    a call in it (a profiler's) sends launches back through JITFunction.run."""
    from triton import knobs
    chain = type(knobs.runtime.launch_enter_hook)()
    assert not launch._hooked(chain) and not launch._hooked(None)
    chain.add(print)
    assert launch._hooked(chain) and launch._hooked(print)
