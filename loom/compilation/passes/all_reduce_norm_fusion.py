"""all_reduce -> fused_add_rms_norm becomes one `loom::all_reduce_add_rms_norm` node.

  a = all_reduce(o_proj or down);  h, r = fused_add_rms_norm(a, r)
    ->  h, r = all_reduce_add_rms_norm(o_proj or down, r)

The op takes one kernel for a decode batch (the all-reduce through symmetric memory with
the add and the norm in the same program, `kernels/all_reduce_norm.py`) where the graph
had two, 64 times a token for Llama-3.1-8B. Larger batches run the all-reduce and then one
add + norm kernel, as Inductor would have fused them.

Only where the one kernel runs: the op is opaque, so in an eagerly launched prefill each
site costs a Python call and a Triton launch that Inductor's own norm kernel does not. So
static graphs take it up to FUSED_MAX_TOKENS tokens, and the general (dynamic) graph is
compiled twice by the piecewise backend: with the fusion for batches up to that size
(decode, replayed from CUDA graphs), without it above (`Piece`, `small_range`).

It runs after sequence parallelism, which rewrites the same sites into reduce-scatters in
the graphs it takes. The first site (the embedding's all-reduce, which becomes the residual
itself) stays.
"""

from __future__ import annotations

import logging

import torch
from torch import fx

from loom.compilation.passes.graph_utils import (ALL_REDUCE, FUSED_ADD_RMS_NORM, RMS_NORM,
                                                 emit, fake_mode, is_op, nodes_of, only_user,
                                                 token_dim)
from loom.distributed.ops import FUSED_NORM_MAX_ROWS as FUSED_MAX_TOKENS

logger = logging.getLogger(__name__)


class AllReduceNormFusionPass:
    name = "all_reduce_norm_fusion"

    def __init__(self) -> None:
        self.small_range = False
        """Set while the general graph is compiled for batches up to FUSED_MAX_TOKENS."""

    def cache_state(self) -> str:
        return repr((self.small_range, FUSED_MAX_TOKENS))

    def __call__(self, graph: fx.Graph) -> int:
        all_reduces = nodes_of(graph, ALL_REDUCE)
        if not all_reduces:
            return 0
        n = token_dim(all_reduces[0])
        static = isinstance(n, int)
        where = f"{n} tokens" if static else (
            f"dynamic token count up to {FUSED_MAX_TOKENS}" if self.small_range
            else f"dynamic token count above {FUSED_MAX_TOKENS}")
        if (n > FUSED_MAX_TOKENS) if static else not self.small_range:
            logger.info("%s: %s: kept %d all_reduce (two kernels a site beat an opaque op "
                        "launched eagerly there)", self.name, where, len(all_reduces))
            return 0
        sites = [(ar, norm) for ar in all_reduces
                 if is_op(norm := only_user(ar), FUSED_ADD_RMS_NORM) and norm.args[0] is ar]
        if not sites:
            # A graph piece holding only the embedding's all-reduce has nothing to fuse.
            first_only = all(any(is_op(u, RMS_NORM) for u in ar.users) for ar in all_reduces)
            (logger.debug if first_only else logger.warning)(
                "%s: %s: none of %d all_reduce feeds a residual add + rms_norm", self.name,
                where, len(all_reduces))
            return 0
        mode = fake_mode(graph)
        for ar, norm in sites:
            x, group = ar.args
            _, residual, weight, eps = norm.args
            with graph.inserting_before(norm):
                fused = emit(graph, mode, torch.ops.loom.all_reduce_add_rms_norm.default,
                             x, residual, weight, eps, group)
            norm.replace_all_uses_with(fused)  # its getitems read the same two outputs
            graph.erase_node(norm)
            graph.erase_node(ar)
        logger.info("%s: %s: fused %d of %d all_reduce+rms_norm", self.name, where,
                    len(sites), len(all_reduces))
        return len(sites)
