"""Decode matmuls to the Triton GEMV (LOOM_DECODE_GEMV=1, an experiment for issue 4).

At batch 1..8 a linear layer is a weight read; cuBLAS reads the small TP=2 weights of
Llama-3.1-8B at 53-69% of the copy rate and adds a split-K reduce kernel to some
(run_x: qkv 11.1 us, down 20.1 us against 8.8 and 16.1 us for loom's GEMV). This pass
rewrites `mm(x, permute(w))` of a weight into `loom.decode_linear(x, w)` in every graph
whose token count can be 1..8 (the general graph, static sizes up to 8). The op picks at
run time: the GEMV where `loom/kernels/configs` has a measured config for the shape and
row count, cuBLAS otherwise, so larger batches through the same graph are unchanged.
Runs after the TP passes, which match the matmuls they fuse first.
"""

from __future__ import annotations

import logging

import torch
from torch import fx

from loom.compilation.passes.graph_utils import MM, emit, fake_mode, is_op, nodes_of, token_dim

logger = logging.getLogger(__name__)

_TRANSPOSES = ("aten.permute.default", "aten.t.default")


def _weight_of(node: fx.Node) -> fx.Node | None:
    """w where node is w transposed, w a 2-D tensor of static shape; else None."""
    if is_op(node, "aten.permute.default") and list(node.args[1]) != [1, 0]:
        return None
    if not any(is_op(node, name) for name in _TRANSPOSES):
        return None
    w = node.args[0]
    val = w.meta.get("val") if isinstance(w, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() != 2 \
            or not all(isinstance(d, int) for d in val.shape):
        return None
    return w


class DecodeGemvPass:
    name = "decode_gemv"

    def __call__(self, graph: fx.Graph) -> int:
        from loom.kernels.gemv import MAX_M
        rewritten = 0
        mode = None
        for node in nodes_of(graph, MM):
            rows = token_dim(node)
            if isinstance(rows, int) and rows > MAX_M:
                continue  # a static graph of more rows than the GEMV takes
            x, wt = node.args
            w = _weight_of(wt)
            if w is None:
                continue
            mode = mode or fake_mode(graph)
            with graph.inserting_before(node):
                new = emit(graph, mode, torch.ops.loom.decode_linear.default, x, w)
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            if not wt.users:
                graph.erase_node(wt)
            rewritten += 1
        if rewritten:
            logger.info("%s: %d matmuls take the Triton GEMV at 1..%d rows where a measured "
                        "config exists (cuBLAS otherwise)", self.name, rewritten, MAX_M)
        return rewritten
