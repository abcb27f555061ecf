"""Remove reshapes and slices that change nothing, so later passes match clean patterns."""

from __future__ import annotations

import logging

import torch
from torch import fx

logger = logging.getLogger(__name__)

_VIEWS = {torch.ops.aten.view.default, torch.ops.aten.reshape.default,
          torch.ops.aten._unsafe_view.default}


def _same_shape(node: fx.Node, source: fx.Node) -> bool:
    a, b = node.meta.get("val"), source.meta.get("val")
    # Compared as text: symbolic sizes must not be turned into guards here.
    return a is not None and b is not None and a.dtype == b.dtype \
        and [str(d) for d in a.shape] == [str(d) for d in b.shape]


class NoOpEliminationPass:
    name = "noop_elimination"

    def __call__(self, graph: fx.Graph) -> int:
        removed = 0
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target in _VIEWS \
                    and isinstance(node.args[0], fx.Node) and _same_shape(node, node.args[0]):
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)
                removed += 1
        logger.debug("%s: removed %d no-op views", self.name, removed)
        return removed
