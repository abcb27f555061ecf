"""The one Inductor post-grad custom pass: runs loom's enabled passes in a fixed order.

Its `uuid()` (part of Inductor's cache key) encodes the pass configuration, so a change of
passes never reuses a graph compiled without them.
"""

from __future__ import annotations

import hashlib
import json
import logging
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

    def _build(self) -> list:
        passes = []
        if self.config.enable_noop:
            from loom.compilation.passes.noop_elimination import NoOpEliminationPass
            passes.append(NoOpEliminationPass())
        if self.config.enable_sequence_parallelism or self.config.enable_async_tp:
            raise NotImplementedError(
                "pass_config: sequence parallelism and async TP passes are not implemented yet "
                "(issue [passes]); run without enable_sequence_parallelism/enable_async_tp")
        return passes

    def __call__(self, graph: torch.fx.Graph) -> None:
        for p in self.passes:
            p(graph)

    def uuid(self) -> str:
        state = json.dumps({"config": asdict(self.config), "tp": self.tp_size,
                            "passes": [type(p).__name__ for p in self.passes]}, sort_keys=True)
        return hashlib.sha256(state.encode()).hexdigest()
