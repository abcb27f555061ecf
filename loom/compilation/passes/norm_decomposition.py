"""The last pass: turn every remaining `loom::rms_norm` / `loom::fused_add_rms_norm` node
back into aten ops, so that Inductor fuses the norm with its neighbours (left as custom
ops they would be opaque extern kernels).

The replacement is the eager reference itself (`layers/norm.py`), traced with make_fx
under the graph's fake mode with Inductor's decompositions, and inlined in place of the
node; so the compiled norm and the eager one cannot drift apart.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
from collections.abc import Callable

from torch import fx
from torch._dispatch.python import enable_python_dispatcher
from torch.fx.experimental.proxy_tensor import make_fx

from loom.compilation.passes.graph_utils import (FUSED_ADD_RMS_NORM, RMS_NORM, fake_mode,
                                                 getitem_users, op_name)
from loom.layers.norm import fused_add_rms_norm, rms_norm

logger = logging.getLogger(__name__)

_REFERENCES: dict[str, Callable] = {RMS_NORM: rms_norm, FUSED_ADD_RMS_NORM: fused_add_rms_norm}


class NormDecompositionPass:
    name = "norm_decomposition"

    def __call__(self, graph: fx.Graph) -> int:
        nodes = [n for n in graph.nodes if op_name(n) in _REFERENCES]
        if not nodes:
            return 0
        mode = fake_mode(graph)
        traced: dict[tuple, fx.GraphModule] = {}  # a model's norms share a few signatures
        for node in nodes:
            key = _signature(node)
            if key not in traced:
                traced[key] = _trace(node, mode)
            _inline(graph, node, traced[key])
        logger.debug("%s: decomposed %d norms", self.name, len(nodes))
        return len(nodes)

    def cache_state(self) -> str:
        """The references are inlined into compiled graphs: their source is in the key."""
        text = "".join(inspect.getsource(f) for f in _REFERENCES.values())
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _signature(node: fx.Node) -> tuple:
    def describe(arg):
        if not isinstance(arg, fx.Node):
            return arg
        val = arg.meta["val"]
        return str(val.shape), str(val.stride()), val.dtype
    return (op_name(node), *map(describe, node.args))


def _trace(node: fx.Node, mode) -> fx.GraphModule:
    from torch._inductor.decomposition import select_decomp_table
    reference = _REFERENCES[op_name(node)]
    tensors = [a for a in node.args if isinstance(a, fx.Node)]
    constants = node.args[len(tensors):]  # eps: baked into the traced graph

    def fn(*xs):
        return reference(*xs, *constants)
    with mode, enable_python_dispatcher():
        return make_fx(fn, select_decomp_table(), tracing_mode="real")(
            *[a.meta["val"] for a in tensors])


def _inline(graph: fx.Graph, node: fx.Node, traced: fx.GraphModule) -> None:
    tensors = [a for a in node.args if isinstance(a, fx.Node)]
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    with graph.inserting_before(node):
        out = graph.graph_copy(traced.graph, dict(zip(placeholders, tensors)))
    if isinstance(out, tuple | list):  # fused_add_rms_norm: readers go through getitem
        for index, item in getitem_users(node).items():
            item.replace_all_uses_with(out[index])
            graph.erase_node(item)
    else:
        node.replace_all_uses_with(out)
    graph.erase_node(node)
