"""Sequence parallelism: all_reduce -> (residual add) -> RMSNorm becomes
reduce_scatter -> RMSNorm on this rank's token shard -> all_gather.

Three shapes of the same site appear in a decoder (matched the same way):
  first  e = all_reduce(embedding);   h = rms_norm(e)                 residual := e
  middle a = all_reduce(o_proj/mlp);  h, r = fused_add_rms_norm(a, r)
  final  the same as middle, its residual output unused
After the rewrite the residual stream is sharded over the token dimension from the first
norm to the last; only the normalised activations are gathered back. A half-rewritten
stream would add sharded residuals to full ones, so the pass checks every site first and
rewrites all of them or none (one warning says why).

The token count must be a multiple of the TP size: a constant in static-shape graphs; in
the dynamic graph the model runner pads to a multiple and `CompiledForward` states it with
`torch._check`, which the shape environment then knows.

Which graphs take it at all is measured (`async_tp_table.sequence_parallel`): a graph the
table leaves out keeps its all-reduces, and the log says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from loom.compilation.passes import async_tp_table
from loom.compilation.passes.graph_utils import (ALL_REDUCE, FUSED_ADD_RMS_NORM, RMS_NORM, emit,
                                                 emit_getitems, fake_mode, getitem_users, is_op,
                                                 nodes_of, token_dim)

logger = logging.getLogger(__name__)


class Refusal(Exception):
    """One site cannot be rewritten, so none is; the message says why."""


@dataclass(frozen=True)
class Site:
    all_reduce: fx.Node
    norm: fx.Node
    """loom.rms_norm (first site) or loom.fused_add_rms_norm (middle and final)."""

    @property
    def fused(self) -> bool:
        return is_op(self.norm, FUSED_ADD_RMS_NORM)

    @property
    def residual_out(self) -> fx.Node | None:
        """The sharded residual this site hands on: e itself, or the norm's output 1."""
        return getitem_users(self.norm).get(1) if self.fused else self.all_reduce


class SequenceParallelismPass:
    name = "sequence_parallelism"

    def __init__(self, tp_size: int) -> None:
        self.tp_size = tp_size

    def cache_state(self) -> str:
        return async_tp_table.cache_state()

    def __call__(self, graph: fx.Graph) -> int:
        all_reduces = nodes_of(graph, ALL_REDUCE)
        total = len(all_reduces)
        if total == 0:
            logger.warning("%s: enabled but the graph has no all_reduce to rewrite", self.name)
            return 0
        n = token_dim(all_reduces[0])
        static = isinstance(n, int)
        choice = async_tp_table.sequence_parallel(
            self.tp_size, all_reduces[0].meta["val"].shape[-1], n if static else None)
        if not choice.apply:
            logger.info("%s: %s: kept %d all_reduce+rms_norm (%s)", self.name,
                        f"{n} tokens" if static else "dynamic token count", total,
                        choice.reason)
            return 0
        try:
            sites = [self._match(ar) for ar in all_reduces]
            self._check_residual_stream(sites)
        except Refusal as why:
            logger.warning("%s: rewrote 0 of %d all_reduce+rms_norm: %s", self.name, total, why)
            return 0
        mode = fake_mode(graph)
        for site in sites:
            self._rewrite(graph, mode, site)
        logger.info("%s: rewrote %d of %d all_reduce+rms_norm", self.name, len(sites), total)
        return len(sites)

    # Matching -------------------------------------------------------------------------
    def _match(self, ar: fx.Node) -> Site:
        norms = [u for u in ar.users if (is_op(u, RMS_NORM) or is_op(u, FUSED_ADD_RMS_NORM))
                 and u.args[0] is ar]
        if len(norms) != 1:
            raise Refusal(f"{ar.name} feeds {len(norms)} norms as input (need exactly 1)")
        self._check_divisible(ar)
        site = Site(ar, norms[0])
        extra = [u for u in ar.users if u is not site.norm]
        if site.fused and extra:
            raise Refusal(f"{ar.name} is also read by {extra[0].name}, outside its norm")
        return site

    def _check_divisible(self, ar: fx.Node) -> None:
        n = token_dim(ar)
        if n is None:
            raise Refusal(f"{ar.name} has no token dimension")
        if isinstance(n, int):
            if n % self.tp_size:
                raise Refusal(f"{n} tokens are not a multiple of TP size {self.tp_size}")
        elif not statically_known_true(n % self.tp_size == 0):
            raise Refusal(f"the token count {n} is not known to be a multiple of TP size "
                          f"{self.tp_size} (the model runner pads it when the pass is on)")

    def _check_residual_stream(self, sites: list[Site]) -> None:
        """Every residual a site reads is one a site hands on, and every residual handed on
        is read only by sites: then the sharded stream never meets a full tensor."""
        residual_reads = {s.norm.args[1]: s for s in sites if s.fused}
        handed_on = {s.residual_out: s for s in sites if s.residual_out is not None}
        for value, reader in residual_reads.items():
            if value not in handed_on:
                raise Refusal(f"{reader.norm.name} adds a residual ({value}) that no rewritten "
                              "norm produced (a piece boundary? set splitting_ops=[])")
        norms = {s.norm for s in sites}
        for value, site in handed_on.items():
            for user in value.users:
                if user is site.norm:
                    continue
                if user not in norms or user.args[1] is not value or user.args[0] is value:
                    raise Refusal(f"the residual {value.name} is read by {user.name}, which is "
                                  "not a rewritten norm (it would see a token shard)")

    # Rewriting ------------------------------------------------------------------------
    def _rewrite(self, graph: fx.Graph, mode, site: Site) -> None:
        ar, norm = site.all_reduce, site.norm
        partial, group = ar.args[0], ar.args[1]
        with graph.inserting_before(norm):
            shard = emit(graph, mode, torch.ops.loom.reduce_scatter.default, partial, 0,
                         self.tp_size, group)
            if site.fused:
                self._rewrite_fused(graph, mode, site, shard, group)
            else:
                normed = emit(graph, mode, torch.ops.loom.rms_norm.default, shard, *norm.args[1:])
                norm.replace_all_uses_with(self._gather(graph, mode, normed, group))
                ar.replace_all_uses_with(shard)  # the residual readers now get the shard
        graph.erase_node(norm)
        graph.erase_node(ar)

    def _rewrite_fused(self, graph: fx.Graph, mode, site: Site, shard: fx.Node,
                       group: str) -> None:
        norm = site.norm
        new = emit(graph, mode, torch.ops.loom.fused_add_rms_norm.default, shard,
                   *norm.args[1:])
        normed, residual = emit_getitems(graph, mode, new, 2)
        old = getitem_users(norm)
        if 0 in old:
            old[0].replace_all_uses_with(self._gather(graph, mode, normed, group))
        if 1 in old:
            old[1].replace_all_uses_with(residual)
        for item in [*old.values(), normed, residual]:
            if not item.users:
                graph.erase_node(item)

    def _gather(self, graph: fx.Graph, mode, shard: fx.Node, group: str) -> fx.Node:
        return emit(graph, mode, torch.ops.loom.all_gather.default, shard, 0, self.tp_size,
                    group)
