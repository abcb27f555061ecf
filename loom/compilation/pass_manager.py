"""The one Inductor post-grad custom pass: runs loom's enabled passes in a fixed order.

  no-op cleanup -> sequence parallelism -> async TP -> all-reduce + norm fusion
  -> decode GEMV (LOOM_DECODE_GEMV=1) -> norm decomposition (always last)

Its `uuid()` (part of Inductor's cache key) encodes the pass configuration, the TP size
and the source of every pass, so neither a config change nor a code change ever reuses a
graph compiled without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import logging
import sys
from dataclasses import asdict, dataclass

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from loom.config import PassConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SequenceParallelPlan:
    """Which graphs of a config take sequence parallelism (the measured table decides)."""

    static_sizes: frozenset[int] = frozenset()
    dynamic: bool = False
    """The dynamic graph too: then the runner pads every batch to a multiple of the TP size."""
    reason: str = ""

    @property
    def any(self) -> bool:
        """Some graph is rewritten, so the forward compiles as one graph (no splitting)."""
        return self.dynamic or bool(self.static_sizes)


class PassManager(CustomGraphPass):
    def __init__(self, config: PassConfig, tp_size: int) -> None:
        self.config = config
        self.tp_size = tp_size
        self._fusion = None
        """The all-reduce + norm fusion pass, when enabled (its range is set from here)."""
        self.passes = self._build()
        self.sp_plan = SequenceParallelPlan()
        """Set by `plan()`; empty until then."""

    @property
    def range_split(self) -> int | None:
        """Token count up to which the general graph is compiled separately (with the
        all-reduce + norm fusion), or None: one general graph. None too where sequence
        parallelism takes the general graph: it leaves no all-reduce to fuse."""
        from loom.compilation.passes.all_reduce_norm_fusion import FUSED_MAX_TOKENS
        if self._fusion is None or self.sp_plan.dynamic:
            return None
        return FUSED_MAX_TOKENS

    @contextlib.contextmanager
    def small_range(self):
        """Compile the general graph for batches up to `range_split` tokens meanwhile."""
        self._fusion.small_range = True
        try:
            yield
        finally:
            self._fusion.small_range = False

    @property
    def sequence_parallel(self) -> bool:
        """Whether the sequence-parallelism pass is enabled at all."""
        return any(p.name == "sequence_parallelism" for p in self.passes)

    def plan(self, compile_sizes: list[int], hidden_size: int) -> SequenceParallelPlan:
        """Decide, before tracing, which graphs the sequence-parallelism pass will rewrite:
        the same per-shape choice the pass makes on each graph."""
        if self.sequence_parallel:
            from loom.compilation.passes import async_tp_table
            static = frozenset(
                n for n in compile_sizes if n % self.tp_size == 0
                and async_tp_table.sequence_parallel(self.tp_size, hidden_size, n).apply)
            dynamic = async_tp_table.sequence_parallel(self.tp_size, hidden_size, None)
            self.sp_plan = SequenceParallelPlan(static, dynamic.apply, dynamic.reason)
        return self.sp_plan

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
        if self.config.enable_all_reduce_norm_fusion and self.tp_size > 1:
            from loom.compilation.passes.all_reduce_norm_fusion import AllReduceNormFusionPass
            self._fusion = AllReduceNormFusionPass()
            passes.append(self._fusion)
        from loom import envs
        if envs.decode_gemv():
            import loom.kernels.gemv_decode  # noqa: F401  (registers torch.ops.loom.decode_linear)
            from loom.compilation.passes.decode_gemv import DecodeGemvPass
            passes.append(DecodeGemvPass(fuse_norm=self.tp_size == 1
                                         and envs.decode_norm_gemv()))
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
