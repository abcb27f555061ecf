"""Decode matmuls to the Triton GEMV (on where CUDA is; LOOM_DECODE_GEMV=0 turns it off).

At batch 1..16 a linear layer is a weight read; cuBLAS reads the small TP=2 weights of
Llama-3.1-8B at 53-69% of the copy rate and adds a split-K reduce kernel to some
(run_x: qkv 11.1 us, down 20.1 us against 8.8 and 16.1 us for loom's GEMV). This pass
rewrites `mm(x, permute(w))` of a weight into `loom.decode_linear(x, w)` in every graph
whose token count can be 1..16 (the general graph, static sizes up to 16). The op picks at
run time: the GEMV where `loom/kernels/configs` has a measured config for the shape and
row count, cuBLAS otherwise, so larger batches through the same graph are unchanged.
Runs after the TP passes, which match the matmuls they fuse first.

Neighbours go into the GEMV with the matmul: an MLP's SiLU·mul before its down
projection, and at TP=1 (unless LOOM_DECODE_NORM_GEMV=0) the residual add + RMSNorm
before qkv and gate_up, which otherwise runs as a kernel of its own (2.1-2.4 us at batch 1
on an H200, plus the idle between two kernels, twice a layer: run_zzz21). Past 16 rows (a
prompt through the general graph) the norm op runs loom's add + norm kernel where Inductor
would have run its own. A projection with LoRA (`loom.lora_add` reading the same input)
keeps both fusions: the LoRA op is handed the norm's residual sum or the SiLU·mul's
[gate | up] and makes its input itself (`loom.lora.layers`).
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
from torch import fx

from loom.compilation.passes.graph_utils import (MM, emit, emit_getitems, fake_mode,
                                                 getitem_users, is_op, nodes_of, token_dim)

logger = logging.getLogger(__name__)

_TRANSPOSES = ("aten.permute.default", "aten.t.default")
_FP8_LINEAR = "loom.fp8_linear.default"
_LORA = "loom.lora_add.default"


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


def _strip_convert(node: Any) -> Any:
    return node.args[0] if is_op(node, "prims.convert_element_type.default") else node


def _silu_of(node: Any) -> fx.Node | None:
    """g where node is silu(g), as Inductor decomposes it: g / (1 + exp(-g)), computed in
    float32 and rounded back (or aten.silu itself); else None."""
    node = _strip_convert(node)
    if is_op(node, "aten.silu.default"):
        return node.args[0]
    if not is_op(node, "aten.div.Tensor"):
        return None
    num, den = node.args
    if not (is_op(den, "aten.add.Tensor") and den.args[1] == 1
            and is_op(den.args[0], "aten.exp.default")
            and is_op(den.args[0].args[0], "aten.neg.default")
            and den.args[0].args[0].args[0] is num):
        return None
    return _strip_convert(num)


def _silu_mul_source(node: Any) -> fx.Node | None:
    """x [M, 2K] where node is silu(x[:, :K]) * x[:, K:] (the MLP's split of its gate_up
    output); else None."""
    if not is_op(node, "aten.mul.Tensor"):
        return None
    for act, up in (node.args, node.args[::-1]):
        gate = _silu_of(act)
        if gate is None or not (_is_getitem(gate) and _is_getitem(up)):
            continue
        split = gate.args[0]
        if not (up.args[0] is split and gate.args[1] == 0 and up.args[1] == 1
                and is_op(split, "aten.split.Tensor") and split.args[2] in (-1, 1)):
            continue
        x = split.args[0]
        val = x.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dim() == 2 and val.shape[1] == 2 * split.args[1]:
            return x
    return None


def _is_getitem(node: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" \
        and node.target is operator.getitem


def _erase_unused(graph: fx.Graph, node: Any) -> None:
    """Erase node and, in turn, the inputs it leaves unused (pure ops only: those the
    rewritten activation was built of)."""
    pending, erased = [node], set()
    while pending:
        n = pending.pop()
        if not isinstance(n, fx.Node) or n in erased or n.users or n.op != "call_function" \
                or n.is_impure():
            continue
        inputs = n.all_input_nodes
        graph.erase_node(n)
        erased.add(n)
        pending.extend(inputs)


def _lora_readers(x: fx.Node, mm: fx.Node) -> list[fx.Node] | None:
    """x's readers other than the matmul mm, where each is a LoRA term of x as given (no
    producer handed to it yet); None if anything else reads x."""
    others = [u for u in x.users if u is not mm]
    if all(is_op(u, _LORA) and len(u.args) == 6 and not u.kwargs and u.args[1] is x
           and x not in u.args[2:] for u in others):
        return others
    return None


def _hand_over(graph: fx.Graph, mode, lora_readers: list[fx.Node], source: fx.Node,
               **producer: Any) -> None:
    """Replace each LoRA term by one reading its input's producer: source, with the op's
    arguments that say how to make the input from it (norm_weight and eps, or silu_mul;
    as keywords, which Inductor's lowering expects of arguments past the defaults). A new
    node, not new arguments: Inductor lays a custom op's inputs out as the node's traced
    inputs (meta "eager_input_vals") were."""
    for lora in lora_readers:
        y, _, a, b, mask, slices = lora.args
        with graph.inserting_before(lora):
            new = emit(graph, mode, torch.ops.loom.lora_add.default, y, source, a, b, mask,
                       slices, **producer)
        lora.replace_all_uses_with(new)
        graph.erase_node(lora)


def _norm_source(node: Any, mm: fx.Node) -> tuple[fx.Node, list[fx.Node]] | None:
    """(The loom.fused_add_rms_norm node whose normalised output node is, the LoRA terms
    reading that output), where nothing else but mm reads it; else None."""
    if not (_is_getitem(node) and node.args[1] == 0):
        return None
    norm, loras = node.args[0], _lora_readers(node, mm)
    return (norm, loras) if is_op(norm, "loom.fused_add_rms_norm.default") \
        and loras is not None else None


class DecodeGemvPass:
    """fuse_norm: a residual add + RMSNorm whose only reader is the matmul goes into the
    GEMV too (`loom.decode_add_rms_norm_linear`); for TP=1, where no all-reduce fusion
    has taken the norms (with TP they follow an all-reduce, whose own pass owns them)."""

    name = "decode_gemv"

    def __init__(self, fuse_norm: bool = False) -> None:
        self.fuse_norm = fuse_norm

    def cache_state(self) -> str:
        return repr(self.fuse_norm)

    def __call__(self, graph: fx.Graph) -> int:
        from loom.kernels.gemv import MAX_M
        rewritten = with_silu = with_norm = 0
        mode = None
        for node in nodes_of(graph, MM) + nodes_of(graph, _FP8_LINEAR):
            rows = token_dim(node)
            if isinstance(rows, int) and rows > MAX_M:
                continue  # a static graph of more rows than the GEMV takes
            if is_op(node, _FP8_LINEAR):  # picks the GEMV itself: only neighbours to fuse
                (x, w, *scales), wt = node.args, None
            else:
                (x, wt), scales = node.args, []
                w = _weight_of(wt)
                if w is None:
                    continue
            mode = mode or fake_mode(graph)
            norm = _norm_source(x, node) if self.fuse_norm else None
            if norm is not None:
                self._with_norm(graph, mode, node, *norm, w, scales)
                with_norm += 1
            elif scales and _silu_mul_source(x) is None:
                continue
            else:
                with_silu += self._plain(graph, mode, node, x, w, scales)
            if wt is not None:
                _erase_unused(graph, wt)
            rewritten += 1
        if rewritten:
            logger.info("%s: %d matmuls take the Triton GEMV at 1..%d rows where a measured "
                        "config exists (cuBLAS otherwise), %d of them with the SiLU·mul "
                        "before them, %d with the residual add + RMSNorm", self.name,
                        rewritten, MAX_M, with_silu, with_norm)
        return rewritten

    @staticmethod
    def _plain(graph: fx.Graph, mode, node: fx.Node, x: fx.Node, w: fx.Node,
               scales: list) -> int:
        """mm -> decode_linear, or decode_silu_mul_linear for an MLP's down projection
        (returns 1 then; an fp8 one's scales go with it)."""
        gate_up = _silu_mul_source(x)
        loras = _lora_readers(x, node) if gate_up is not None else None
        if loras:
            _hand_over(graph, mode, loras, gate_up, silu_mul=True)
        with graph.inserting_before(node):
            if gate_up is not None:  # the down projection: its activation goes in too
                new = emit(graph, mode, torch.ops.loom.decode_silu_mul_linear.default,
                           gate_up, w, *scales)
            else:
                new = emit(graph, mode, torch.ops.loom.decode_linear.default, x, w)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        _erase_unused(graph, x)
        return int(gate_up is not None)

    @staticmethod
    def _with_norm(graph: fx.Graph, mode, node: fx.Node, norm: fx.Node,
                   loras: list[fx.Node], w: fx.Node, scales: list) -> None:
        """norm's two outputs and the mm (or fp8 linear) reading the first -> one
        decode_add_rms_norm_linear, placed where the norm was (its residual output may
        have readers before the mm). LoRA terms of the normalised rows take the residual
        sum and the norm's weight instead."""
        x, residual, norm_weight, eps = norm.args
        with graph.inserting_before(norm):
            fused = emit(graph, mode, torch.ops.loom.decode_add_rms_norm_linear.default,
                         x, residual, norm_weight, eps, w, *scales)
            y, residual_out = emit_getitems(graph, mode, fused, 2)
        _hand_over(graph, mode, loras, residual_out, norm_weight=norm_weight, eps=eps)
        node.replace_all_uses_with(y)
        graph.erase_node(node)
        items = getitem_users(norm)
        graph.erase_node(items[0])  # the normalised rows: the mm was their one reader
        if 1 in items:
            items[1].replace_all_uses_with(residual_out)
            graph.erase_node(items[1])
        graph.erase_node(norm)
