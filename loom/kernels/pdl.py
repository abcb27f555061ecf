"""Programmatic dependent launch (PDL, Hopper and later) for the small-batch decode chain.

At batch 1 a decode step is ~250 kernels back to back in one CUDA graph, and every
boundary costs: the next kernel's blocks start only once the last one's have finished, and
a GEMV then spends its first microseconds with the memory system half busy. Launched with
PDL, a kernel may start while the one before it is still running, once that one's blocks
have all signalled (`gdc_launch_dependents`); it must then wait (`gdc_wait`) before touching
anything an earlier kernel writes. The weights are written by no kernel, so a GEMV can pull
the first slice of its slab into L2 before it waits: the time an all-reduce spends on the
peer, or the decode attention on its latency-bound loop, streams the next matrix instead.

Rules each kernel with a `PDL` constexpr keeps when it is on:
* `wait_then_release` is its first step on every path (an early `return` included), so its
  completion implies its predecessor's and the chain stays ordered through kernels that
  read nothing of their predecessor;
* only after that wait does it let its own dependent start, so at most one kernel runs
  ahead and prefetches, never a chain of them.
A kernel launched without the attribute (cuBLAS, Inductor's) waits for its predecessor as
usual, and one launched with it after such a kernel starts when that one completes; mixing
is safe. Off under the CPU interpreter and before sm_90; on only with LOOM_PDL=1.

Measured (run_zk, run_zl: 1 H200, Llama-3.1-8B decode at batch 1): not a win as it stands.
4.338 ms/token without, 4.396-4.439 with PDL, 4.744 with 2 MiB and 5.496 with 24 MiB of
weight prefetch. The kernels did overlap, but the work after each wait ran slower: the
decode attention 6.0 -> 8.4 us past the GEMV's end, the o projection 9.9 -> 20 us with the
prefetch. Left opt-in for issue 4's TP=2 decode, where the all-reduces' waits on the peer
are the windows it was meant for; not yet measured there.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from loom import envs


def enabled(device: torch.device) -> bool:
    """Whether kernels launched on `device` use PDL: CUDA, compute capability 9.0 or later,
    not the interpreter, and LOOM_PDL=1 (`envs.pdl`, off by default)."""
    if device.type != "cuda" or not envs.pdl() or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _hopper_or_later(device.index if device.index is not None
                            else torch.cuda.current_device())


@functools.cache
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


@triton.jit
def wait_then_release():
    """Wait for the previous kernel to finish and its writes to be visible, then allow the
    next kernel (if launched with PDL) to start."""
    tl.extra.cuda.gdc_wait()
    tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def prefetch_l2(ptrs, nbytes):
    """Ask the copy engine to bring `nbytes` (a multiple of 16) at each address of `ptrs`
    (16-byte aligned, global memory) into L2; no registers are filled and nothing waits."""
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;", "=r,l,r", [ptrs, nbytes],
        dtype=tl.int32, is_pure=False, pack=1)
