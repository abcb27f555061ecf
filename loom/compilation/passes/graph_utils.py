"""Small helpers the passes share: find op nodes, insert new ones with fake values.

Every node a pass inserts gets `meta["val"]` (a fake tensor, symbolic sizes included)
computed by running its op under the graph's fake mode, because later passes and
Inductor's lowering read shapes from there.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import fx
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensorMode

ALL_REDUCE = "loom.all_reduce.default"
ALL_GATHER = "loom.all_gather.default"
REDUCE_SCATTER = "loom.reduce_scatter.default"
RMS_NORM = "loom.rms_norm.default"
FUSED_ADD_RMS_NORM = "loom.fused_add_rms_norm.default"
MM = "aten.mm.default"


def op_name(node: fx.Node) -> str | None:
    """'namespace.op.overload' for an op node, None for anything else."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return None
    return str(node.target)


def is_op(node: Any, name: str) -> bool:
    return isinstance(node, fx.Node) and op_name(node) == name


def nodes_of(graph: fx.Graph, name: str) -> list[fx.Node]:
    return [n for n in graph.nodes if op_name(n) == name]


def getitem_users(node: fx.Node) -> dict[int, fx.Node]:
    """index -> the getitem node reading that output of a tuple-returning op."""
    return {u.args[1]: u for u in node.users
            if u.op == "call_function" and u.target is operator.getitem}


def only_user(node: fx.Node) -> fx.Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def fake_mode(graph: fx.Graph) -> FakeTensorMode:
    vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode(vals)
    if mode is None:
        raise RuntimeError("the graph carries no fake values; passes need meta['val']")
    return mode


def emit(graph: fx.Graph, mode: FakeTensorMode, target: Callable, *args: Any,
         **kwargs: Any) -> fx.Node:
    """Insert target(*args, **kwargs) at the graph's insertion point, with its fake value."""
    node = graph.call_function(target, args, kwargs)
    fake_args, fake_kwargs = fx.node.map_arg((args, kwargs), lambda n: n.meta["val"])
    with mode:
        node.meta["val"] = target(*fake_args, **fake_kwargs)
    return node


def emit_getitems(graph: fx.Graph, mode: FakeTensorMode, node: fx.Node,
                  count: int) -> list[fx.Node]:
    return [emit(graph, mode, operator.getitem, node, i) for i in range(count)]


def token_dim(node: fx.Node) -> int | torch.SymInt | None:
    """Dimension 0 of a node's fake value: the token count in every graph we rewrite."""
    val = node.meta.get("val")
    return val.shape[0] if isinstance(val, torch.Tensor) and val.dim() > 0 else None


def hoist(node: fx.Node, before: fx.Node) -> bool:
    """Move node (and the pure ops it reads) above `before` if it comes later; False when
    it cannot move (an input is defined after `before`, or it is not a plain op)."""
    order = {n: i for i, n in enumerate(before.graph.nodes)}
    return _hoist(node, before, order)


def _hoist(node: fx.Node, before: fx.Node, order: dict[fx.Node, int]) -> bool:
    if order[node] < order[before]:
        return True
    if op_name(node) is None or node.target._schema.is_mutable:
        return False
    if not all(_hoist(i, before, order) for i in node.all_input_nodes):
        return False
    before.prepend(node)
    order[node] = order[before] - 0.5
    return True
