"""vLLM's worker_extension_cls: a class whose methods join each worker's, reachable by name
through LLM.collective_rpc and /collective_rpc (an RL trainer's weight-sync methods)."""

from __future__ import annotations

import importlib


def extend(worker, qualname: str) -> frozenset[str]:
    """Make the worker an instance of its class with qualname's class mixed in; returns the
    extension's public method names. Raises ValueError for a name that does not import, or
    a method that would shadow one of the worker's own."""
    module, _, name = qualname.rpartition(".")
    if not module:
        raise ValueError(f"worker_extension_cls: must name a class as module.Class, got "
                         f"{qualname!r}")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"worker_extension_cls: cannot import {qualname!r}: {e}") from None
    if not isinstance(cls, type):
        raise ValueError(f"worker_extension_cls: {qualname!r} is not a class")
    methods = {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}
    clash = sorted(n for n in methods if hasattr(type(worker), n))
    if clash:
        raise ValueError(f"worker_extension_cls: {qualname} defines {', '.join(clash)}, which "
                         "loom's Worker has; rename them")
    worker.__class__ = type(f"{type(worker).__name__}With{cls.__name__}",
                            (type(worker), cls), {})
    return frozenset(methods)
