"""Collective matmuls that overlap their communication with part of their own matmul.

The async-TP pass can use these instead of PyTorch's `symm_mem` fused ops
(`LOOM_ASYNC_TP_IMPL=overlap`). Each splits the work by destination rank rather than into
many small chunks, so every GEMM stays one large, contiguous matmul:

- `all_gather_matmul`: start the all-gather of the local token shard. Meanwhile multiply the
  shard the rank already holds (its own rows of the output). Then multiply the gathered
  rows of the other ranks (at most two contiguous blocks).
- `matmul_reduce_scatter`: multiply the rows that other ranks own first and start sending
  those partial sums to them. Meanwhile multiply the rank's own rows, then add what the
  others sent.

At TP=2 the transfer (1/2 of the activation) hides behind half the GEMM whenever the
GEMM takes longer than the transfer. Collectives go through the process group (NCCL on
GPU, gloo on CPU), so the ops run anywhere and take any token count: the dynamic graph
can be rewritten too. Below `min_tokens` they fall back to the plain collective and one
matmul. There the overlap cannot pay for a second GEMM launch, and CUDA-graph decode
sizes never leave that branch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from loom.distributed.parallel_state import get_group
from loom.library import loom_op


@loom_op("all_gather_matmul", "(Tensor a, Tensor[] weights, int world_size, str group_name, "
                              "int min_tokens) -> (Tensor, Tensor[])")
def all_gather_matmul(a: torch.Tensor, weights: list[torch.Tensor], world_size: int,
                      group_name: str, min_tokens: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(all_gather(a) along rows, [all_gather(a) @ w for w in weights])."""
    group = get_group(group_name)
    m = a.shape[0]
    a = a.contiguous()
    gathered = a.new_empty((world_size * m, a.shape[1]))
    if group.world_size == 1:
        gathered.copy_(a)
        return gathered, [gathered @ w for w in weights]
    if world_size * m < min_tokens:
        dist.all_gather_into_tensor(gathered, a, group=group.group)
        return gathered, [gathered @ w for w in weights]
    work = dist.all_gather_into_tensor(gathered, a, group=group.group, async_op=True)
    own = slice(group.rank * m, (group.rank + 1) * m)
    outs = [a.new_empty((world_size * m, w.shape[1])) for w in weights]
    for out, w in zip(outs, weights):
        torch.mm(a, w, out=out[own])
    work.wait()
    for block in _other_blocks(group.rank, m, world_size):
        for out, w in zip(outs, weights):
            torch.mm(gathered[block], w, out=out[block])
    return gathered, outs


@all_gather_matmul.register_fake
def _(a, weights, world_size, group_name, min_tokens):
    rows = world_size * a.shape[0]
    return a.new_empty((rows, a.shape[1])), [a.new_empty((rows, w.shape[1])) for w in weights]


@loom_op("matmul_reduce_scatter", "(Tensor a, Tensor weight, int world_size, str group_name, "
                                  "int min_tokens) -> Tensor")
def matmul_reduce_scatter(a: torch.Tensor, weight: torch.Tensor, world_size: int,
                          group_name: str, min_tokens: int) -> torch.Tensor:
    """reduce_scatter(a @ weight) along rows: this rank's 1/world_size of the rows, summed."""
    group = get_group(group_name)
    rows = a.shape[0]
    m = rows // world_size
    if group.world_size == 1:
        return a @ weight
    if rows < min_tokens:
        out = a.new_empty((m, weight.shape[1]))
        dist.reduce_scatter_tensor(out, (a @ weight).contiguous(), group=group.group)
        return out
    ops, received = [], []
    for peer in range(world_size):
        if peer == group.rank:
            continue
        block = slice(peer * m, (peer + 1) * m)
        partial = a[block] @ weight
        buf = torch.empty_like(partial)
        received.append(buf)
        global_peer = dist.get_global_rank(group.group, peer)
        ops += [dist.P2POp(dist.isend, partial, global_peer, group.group),
                dist.P2POp(dist.irecv, buf, global_peer, group.group)]
    works = dist.batch_isend_irecv(ops)
    out = a[group.rank * m:(group.rank + 1) * m] @ weight
    for work in works:
        work.wait()
    for buf in received:
        out += buf
    return out


@matmul_reduce_scatter.register_fake
def _(a, weight, world_size, group_name, min_tokens):
    return a.new_empty((a.shape[0] // world_size, weight.shape[1]))


def _other_blocks(rank: int, m: int, world_size: int) -> list[slice]:
    """The gathered rows of every other rank, as at most two contiguous blocks."""
    blocks = []
    if rank > 0:
        blocks.append(slice(0, rank * m))
    if rank < world_size - 1:
        blocks.append(slice((rank + 1) * m, world_size * m))
    return blocks


@loom_op("matmul_reduce_scatter_partials",
         "(Tensor a, Tensor b, int world_size, str group_name) -> Tensor")
def matmul_reduce_scatter_partials(a: torch.Tensor, b: torch.Tensor, world_size: int,
                                   group_name: str) -> torch.Tensor:
    """[world_size, M / world_size, N]: every rank's partial product a @ b for this rank's
    rows; their sum over dim 0 is reduce_scatter(a @ b).

    The async-TP pass emits this op and the sum as its own node, so that Inductor adds the
    partials inside the kernel that reads them next (the residual add + RMSNorm), where
    PyTorch's `fused_matmul_reduce_scatter` spends a separate reduction kernel (69 us per
    site at 8192 tokens on H200, 4.4 ms of a 122 ms prefill). On CUDA the exchange is the
    one that op pipelines with the matmul (symmetric memory, the copy engine)."""
    group = get_group(group_name)
    n = b.shape[1]
    if group.world_size == 1:
        return (a @ b).unsqueeze(0)
    if a.is_cuda:
        out = a.new_empty(a.shape[0], n)
        from torch.distributed._symmetric_memory import _pipelined_produce_and_all2all
        rows = a.chunk(world_size)

        def produce(rank: int, chunk: torch.Tensor) -> None:
            torch.mm(rows[rank], b, out=chunk)
        _pipelined_produce_and_all2all(produce, out, group.c10d_name)
        return out.view(world_size, -1, n)
    return partials_by_all_to_all(a, b, world_size, group)  # CPU (gloo)


def partials_by_all_to_all(a: torch.Tensor, b: torch.Tensor, world_size: int,
                           group) -> torch.Tensor:
    """The same exchange, unpipelined: chunk r of a @ b goes to rank r."""
    out = a.new_empty(a.shape[0], b.shape[1])
    dist.all_to_all_single(out, (a @ b).contiguous(), group=group.group)
    return out.view(world_size, -1, b.shape[1])


@matmul_reduce_scatter_partials.register_fake
def _(a, b, world_size, group_name):
    return a.new_empty(world_size, a.shape[0] // world_size, b.shape[1])
