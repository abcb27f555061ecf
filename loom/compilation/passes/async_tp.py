"""Async TP: overlap the sequence-parallel collectives with their matmuls.

  all_gather(x) -> mm(., B1), mm(., B2)...  ->  symm_mem.fused_all_gather_matmul(x, [B1, B2...])
  mm(A, B) -> reduce_scatter               ->  sum(loom.matmul_reduce_scatter_partials(A, B), 0)

Runs after sequence parallelism, which creates these collectives. One gather feeding
several matmuls (QKV, gate_up, an MoE router) becomes one fused op; readers of the gathered
activation other than matmuls (an MoE expert block) take the op's returned A.

Only static-shape graphs (`compile_sizes`) are fused, and only where the measured table
(`async_tp_table.py`) says the fused op beats NCCL + cuBLAS at that token count; the
dynamic graph keeps the unfused collectives, and the log says which applied.

With LOOM_ASYNC_TP_IMPL=p2p the static sites become loom's leaner TP=2 ops over symmetric
memory instead (`loom/distributed/p2p_matmul.py`, one barrier a call). With
LOOM_ASYNC_TP_IMPL=overlap the same sites become loom's own
`loom::all_gather_matmul` / `loom::matmul_reduce_scatter` instead
(`loom/distributed/collective_matmul.py`): they take any token count, so every graph is
rewritten (the dynamic one too), and they choose at run time whether to overlap
(LOOM_ASYNC_TP_MIN_TOKENS and up, default 1024).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx

from loom import envs
from loom.compilation.passes import async_tp_table
from loom.compilation.passes.graph_utils import (ALL_GATHER, ALL_REDUCE, MM, REDUCE_SCATTER,
                                                 emit, fake_mode, hoist, is_op, nodes_of,
                                                 only_user, token_dim)
from loom.distributed import collective_matmul  # noqa: F401 - registers loom's overlap ops
from loom.distributed import p2p_matmul  # noqa: F401 - registers loom's TP=2 p2p ops
from loom.distributed.parallel_state import get_group

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatherSite:
    all_gather: fx.Node
    matmuls: list[fx.Node]

    @property
    def hidden_size(self) -> int:
        return self.all_gather.meta["val"].shape[-1]


@dataclass(frozen=True)
class ScatterSite:
    reduce_scatter: fx.Node
    matmul: fx.Node


class AsyncTPPass:
    name = "async_tp"

    def __init__(self, tp_size: int) -> None:
        self.tp_size = tp_size

    def cache_state(self) -> str:
        return repr((async_tp_table.cache_state(), envs.async_tp_impl(), OVERLAP_MIN_TOKENS))

    def __call__(self, graph: fx.Graph) -> int:
        gathers = [s for s in map(_match_gather, nodes_of(graph, ALL_GATHER)) if s]
        scatters = [s for s in map(_match_scatter, nodes_of(graph, REDUCE_SCATTER)) if s]
        if not gathers and not scatters:
            if nodes_of(graph, ALL_REDUCE):  # the table kept sequence parallelism off here
                logger.info("%s: sequence parallelism left this graph's all-reduces; "
                            "nothing to fuse", self.name)
            else:
                logger.warning("%s: enabled but matched no all_gather->matmul or "
                               "matmul->reduce_scatter", self.name)
            return 0
        if envs.async_tp_impl() == "overlap":
            return self._rewrite_overlap(graph, gathers, scatters)
        sites = [s.all_gather for s in gathers] + [s.reduce_scatter for s in scatters]
        num_tokens = token_dim(sites[0]) if gathers else token_dim(scatters[0].matmul)
        if not isinstance(num_tokens, int):
            logger.info("%s: dynamic token count: kept %d all_gather+matmul and %d "
                        "matmul+reduce_scatter unfused (fused ops need a static M: list the "
                        "size in compile_sizes)", self.name, len(gathers), len(scatters))
            return 0
        group = get_group(sites[0].args[3]).c10d_name
        if group is None:
            logger.warning("%s: group %s has one rank; nothing to fuse", self.name,
                           sites[0].args[3])
            return 0
        return self._rewrite(graph, gathers, scatters, num_tokens, group)

    def _rewrite(self, graph: fx.Graph, gathers: list[GatherSite], scatters: list[ScatterSite],
                 num_tokens: int, group: str) -> int:
        hidden = gathers[0].hidden_size if gathers else scatters[0].matmul.meta["val"].shape[-1]
        choice = async_tp_table.choose(self.tp_size, hidden, num_tokens)
        mode = fake_mode(graph)
        p2p = envs.async_tp_impl() == "p2p"

        def gather_op(ag, weights, keep_a):
            if p2p:
                _, _, world_size, group_name = ag.args
                return emit(graph, mode, torch.ops.loom.all_gather_matmul_p2p.default,
                            ag.args[0], weights, world_size, group_name, keep_a)
            return emit(graph, mode, torch.ops.symm_mem.fused_all_gather_matmul.default,
                        ag.args[0], weights, 0, group, return_A=keep_a)

        partials_op = (torch.ops.loom.matmul_reduce_scatter_partials_p2p.default if p2p
                       else torch.ops.loom.matmul_reduce_scatter_partials.default)

        def scatter_op(rs, mm):
            # The partials' sum is a graph node: Inductor folds it into the kernel that
            # reads the reduce-scatter's output (the residual add + RMSNorm).
            _, _, world_size, group_name = rs.args
            partials = emit(graph, mode, partials_op, mm.args[0], mm.args[1], world_size,
                            group_name)
            return emit(graph, mode, torch.ops.aten.sum.dim_IntList, partials, [0])

        fused_ag = sum(_rewrite_gather(graph, mode, s, gather_op) for s in gathers) \
            if choice.fuse_all_gather else 0
        fused_rs = sum(_rewrite_scatter(graph, s, scatter_op) for s in scatters) \
            if choice.fuse_reduce_scatter else 0
        logger.info("%s: %d tokens: fused %d of %d all_gather+matmul, %d of %d "
                    "matmul+reduce_scatter (%s)", self.name, num_tokens, fused_ag, len(gathers),
                    fused_rs, len(scatters), choice.reason)
        return fused_ag + fused_rs


    def _rewrite_overlap(self, graph: fx.Graph, gathers: list[GatherSite],
                         scatters: list[ScatterSite]) -> int:
        min_tokens = envs.async_tp_min_tokens()
        min_tokens = OVERLAP_MIN_TOKENS if min_tokens is None else min_tokens
        mode = fake_mode(graph)
        def gather_op(ag, weights, _keep_a):  # A always comes back: it is gathered anyway
            _, _, world_size, group_name = ag.args
            return emit(graph, mode, torch.ops.loom.all_gather_matmul.default, ag.args[0],
                        weights, world_size, group_name, min_tokens)

        def scatter_op(rs, mm):
            _, _, world_size, group_name = rs.args
            return emit(graph, mode, torch.ops.loom.matmul_reduce_scatter.default, mm.args[0],
                        mm.args[1], world_size, group_name, min_tokens)

        fused_ag = sum(_rewrite_gather(graph, mode, s, gather_op) for s in gathers)
        fused_rs = sum(_rewrite_scatter(graph, s, scatter_op) for s in scatters)
        logger.info("%s: loom overlap ops: rewrote %d of %d all_gather+matmul, %d of %d "
                    "matmul+reduce_scatter (overlapped from %d tokens at run time)", self.name,
                    fused_ag, len(gathers), fused_rs, len(scatters), min_tokens)
        return fused_ag + fused_rs


OVERLAP_MIN_TOKENS = 1024
"""Below this many tokens loom's overlap ops run the plain collective and one matmul. A
placeholder until the 2x H200 runs measure the crossover."""


def _match_gather(ag: fx.Node) -> GatherSite | None:
    if ag.args[1] != 0 or ag.meta["val"].dim() != 2:
        return None
    matmuls = [u for u in ag.users if is_op(u, MM) and u.args[0] is ag and u.args[1] is not ag]
    return GatherSite(ag, matmuls) if matmuls else None


def _match_scatter(rs: fx.Node) -> ScatterSite | None:
    mm = rs.args[0]
    if rs.args[1] != 0 or not is_op(mm, MM) or only_user(mm) is not rs:
        return None
    return ScatterSite(rs, mm)


FusedGather = Callable[[fx.Node, list[fx.Node], bool], fx.Node]
"""(all_gather node, matmul weights, whether A is read elsewhere) -> the emitted fused op,
whose output 0 is the gathered A and output 1 the list of matmul outputs."""


def _rewrite_gather(graph: fx.Graph, mode, site: GatherSite, fused_op: FusedGather) -> int:
    ag = site.all_gather
    order = {n: i for i, n in enumerate(graph.nodes)}
    first = min(ag.users, key=order.__getitem__)
    # A weight's transpose may sit after the gather's first reader: move it up, or leave
    # that matmul reading the gathered A.
    matmuls = [mm for mm in site.matmuls if hoist(mm.args[1], first)]
    keep_a = len(matmuls) < len(ag.users)
    with graph.inserting_before(first):
        fused = fused_op(ag, [mm.args[1] for mm in matmuls], keep_a)
        outputs = emit(graph, mode, operator.getitem, fused, 1)
        for i, mm in enumerate(matmuls):
            mm.replace_all_uses_with(emit(graph, mode, operator.getitem, outputs, i))
        if keep_a:  # other readers of A: an MoE block, an unhoistable matmul
            ag.replace_all_uses_with(emit(graph, mode, operator.getitem, fused, 0))
    # Erased only now: the insertion point above may be one of these matmuls.
    for mm in matmuls:
        graph.erase_node(mm)
    graph.erase_node(ag)
    return 1


def _rewrite_scatter(graph: fx.Graph, site: ScatterSite,
                     fused_op: Callable[[fx.Node, fx.Node], fx.Node]) -> int:
    """fused_op(reduce_scatter node, matmul node) emits the op that replaces both."""
    rs, mm = site.reduce_scatter, site.matmul
    with graph.inserting_before(rs):
        fused = fused_op(rs, mm)
    rs.replace_all_uses_with(fused)
    graph.erase_node(rs)
    graph.erase_node(mm)
    return 1
