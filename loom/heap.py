"""The collector policy of a long-running process (the engine, each TP worker)."""

from __future__ import annotations

import gc

from loom import envs


def settle() -> None:
    """Call once start-up is done: what it built lives as long as the process (compiled
    graphs, guards, kernels, the scheduler's KV blocks), so it is collected once and moved
    out of the collector's reach, and from here on collections come at envs.gc_thresholds().
    A full collection during a step then no longer walks the start-up heap."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*envs.gc_thresholds())
