"""Integer helpers for the host side of kernel launches (grids, block sizes, constexprs).

Since Triton 3.5 `triton.cdiv` and `triton.next_power_of_2` are constexpr functions: called
from Python, each goes through a wrapper that unwraps its arguments, 3-5 us a call on this
project's 2-core CPU, and a decode layer's launches made a dozen such calls. These are the
same arithmetic as plain Python.
"""

from __future__ import annotations

import functools


def cdiv(a: int, b: int) -> int:
    """a / b rounded up (triton.cdiv)."""
    return -(-a // b)


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple of `multiple`."""
    return cdiv(n, multiple) * multiple


@functools.cache
def sm_count(device) -> int:
    """The device's streaming multiprocessors (132 on an H100 or H200), asked once: the
    launch helpers size their K splits by it on every call."""
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count


def is_power_of_2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, 0 for n = 0 (triton.next_power_of_2 for n >= 0)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
