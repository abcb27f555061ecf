"""`loom::*` operators: a schema, one Python implementation for every device, a fake.

torch.library.custom_op wraps each call in Python (argument checks, an output aliasing
check); at 32 attention calls and 65 all-reduces per forward outside CUDA graphs that
wrapper was a visible share of a prefill step's host time. Here the implementation is
registered directly with the dispatcher, so a call costs one dispatch. Even that dispatch
(boxing every argument for a Python kernel) took ~39 us of host time for the attention op on
the H200 host (run_zzz66), a third of an eager decode layer's attention: code that runs
outside any graph (eager layers, the split graph between compiled pieces) calls the Python
implementation itself (`python_impl`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

_LIB = torch.library.Library("loom", "FRAGMENT")
_IMPLS: dict[str, Callable] = {}


def loom_op(name: str, schema: str) -> Callable:
    """Decorator: define `loom::<name><schema>` implemented by the function. The function
    gains `register_fake`, a decorator for its shape-only implementation."""
    def define(fn: Callable) -> Callable:
        _LIB.define(name + schema)
        _LIB.impl(name, fn, "CompositeExplicitAutograd")
        _IMPLS[name] = fn
        fn.register_fake = torch.library.register_fake(f"loom::{name}")
        return fn
    return define


def python_impl(target: object) -> Callable | None:
    """The Python function behind `torch.ops.loom.<name>` (its OpOverload or packet), to
    call without the dispatcher; None for any other target."""
    if not isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return None
    if isinstance(target, torch._ops.OpOverload):
        target = target.overloadpacket
    namespace, _, name = target._qualified_op_name.partition("::")
    return _IMPLS.get(name) if namespace == "loom" else None
