"""The one Inductor post-grad custom pass: runs loom's enabled passes in a fixed order.

  no-op cleanup -> sequence parallelism -> async TP -> norm decomposition (always last)

Its `uuid()` (part of Inductor's cache key) encodes the pass configuration, the TP size
and the source of every pass, so neither a config change nor a code change ever reuses a
graph compiled without it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import sys
from dataclasses import asdict

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from loom.config import PassConfig

logger = logging.getLogger(__name__)


class PassManager(CustomGraphPass):
    def __init__(self, config: PassConfig, tp_size: int) -> None:
        self.config = config
        self.tp_size = tp_size
        self.passes = self._build()

    @property
    def sequence_parallel(self) -> bool:
        """Whether the token count must be a multiple of the TP size (the runner pads)."""
        return any(p.name == "sequence_parallelism" for p in self.passes)

    def _build(self) -> list:
        from loom.compilation.passes.norm_decomposition import NormDecompositionPass
        passes = []
        if self.config.enable_noop:
            from loom.compilation.passes.noop_elimination import NoOpEliminationPass
            passes.append(NoOpEliminationPass())
        if self.config.enable_sequence_parallelism and self.tp_size == 1:
            logger.info("pass_config: sequence parallelism and async TP need TP > 1; off")
        elif self.config.enable_sequence_parallelism:
            from loom.compilation.passes.sequence_parallelism import SequenceParallelismPass
            passes.append(SequenceParallelismPass(self.tp_size))
            if self.config.enable_async_tp:
                from loom.compilation.passes.async_tp import AsyncTPPass
                passes.append(AsyncTPPass(self.tp_size))
        passes.append(NormDecompositionPass())
        return passes

    def __call__(self, graph: torch.fx.Graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self) -> str:
        state = json.dumps({
            "config": asdict(self.config), "tp": self.tp_size,
            "passes": [_source_hash(type(p)) for p in self.passes],
            "state": [p.cache_state() for p in self.passes if hasattr(p, "cache_state")],
        }, sort_keys=True)
        return hashlib.sha256(state.encode()).hexdigest()


def _source_hash(cls: type) -> str:
    """The pass's name and a hash of its module's source (and its helpers')."""
    module = sys.modules[cls.__module__]
    sources = [inspect.getsource(module)]
    helpers = sys.modules.get("loom.compilation.passes.graph_utils")
    if helpers is not None:
        sources.append(inspect.getsource(helpers))
    return cls.__name__ + ":" + hashlib.sha256("".join(sources).encode()).hexdigest()[:16]
