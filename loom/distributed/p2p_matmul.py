"""Lean collective matmuls over symmetric memory for TP=2 (`LOOM_ASYNC_TP_IMPL=p2p`).

They do what PyTorch's `fused_all_gather_matmul` and its pipelined matmul + exchange do:
copy-engine transfers between the two GPUs' symmetric buffers, hidden behind the matmul on
the rank's own rows. Per call they spend fewer launches and less host time. At 8192 tokens
the async-TP step waited ~0.5 ms a layer for the host around PyTorch's ops, and their
barriers took 448 × 7 µs (docs/passes.md).

- Each op kind alternates between two buffer slots. The peer read slot p during call i, and
  that read joins its main stream before the barrier of call i + 1. So when call i + 2
  writes slot p again, the read is done. One barrier per call is enough; PyTorch's
  all-gather takes three.
- The all-gather copies the local shard into the slot, then meets the peer at the barrier.
  A side stream pulls the peer's shard, while the main stream multiplies the local shard
  (its own rows of every output), then the peer's shard.
- The reduce-scatter writes the peer's rows of `a @ b` straight into the slot, with no
  copy, then meets the peer at the barrier. The side stream pulls the peer's partial for
  this rank's rows, while the main stream multiplies this rank's rows. The partials come
  back stacked, as `matmul_reduce_scatter_partials` returns them, and the graph sums them
  inside the next kernel.

Not TP=2 on CUDA: PyTorch's fused op and loom's partials op. The CPU, and CUDA graph
captures (a decode size in compile_sizes): the same collectives unpipelined, then the
matmuls (NCCL's are captured; the lean ops pick their slot on the host, and PyTorch's cannot
grow their workspace during a capture). The CPU tests run that path.
"""

from __future__ import annotations

import logging
import math

import torch
import torch.distributed as dist

from loom.distributed.collective_matmul import (matmul_reduce_scatter_partials,
                                                partials_by_all_to_all)
from loom.distributed.parallel_state import get_group
from loom.library import loom_op

logger = logging.getLogger(__name__)


class _Workspace:
    """A group's symmetric buffers: two slots per op kind, grown (by a new rendezvous, on
    every rank at the same call) when a call needs more; old buffers are kept, since a peer
    may still be reading one when it is replaced."""

    def __init__(self, group) -> None:
        self.group = group
        self.handle = None
        self.slot_bytes = 0
        self.kept: list[torch.Tensor] = []
        self.parity = {"ag": 0, "rs": 0}
        self.views: dict[tuple, torch.Tensor] = {}
        self.stream: torch.cuda.Stream | None = None

    def slots(self, kind: str, shape: tuple[int, ...], dtype: torch.dtype,
              device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's and the peer's buffer of the next slot of `kind`, shaped as asked."""
        need = math.prod(shape) * dtype.itemsize
        if need > self.slot_bytes:
            self._grow(need, device)
        p = self.parity[kind]
        self.parity[kind] = 1 - p
        key = (kind, p, shape, dtype)
        if key not in self.views:
            offset = ((0 if kind == "ag" else 2) + p) * self.slot_bytes // dtype.itemsize
            self.views[key] = tuple(
                self.handle.get_buffer(r, shape, dtype, storage_offset=offset)
                for r in (self.handle.rank, 1 - self.handle.rank))
        return self.views[key]

    def _grow(self, need: int, device: torch.device) -> None:
        from torch.distributed import _symmetric_memory as symm_mem
        slot = max(need, 2 * self.slot_bytes)
        slot = -(-slot // 256) * 256  # every slot's start aligned for any dtype
        buf = symm_mem.empty(4 * slot, dtype=torch.uint8, device=device)
        self.handle = symm_mem.rendezvous(buf, self.group.c10d_name)
        self.kept.append(buf)
        self.slot_bytes = slot
        self.views.clear()

    def side_stream(self) -> torch.cuda.Stream:
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        return self.stream


_workspaces: dict[str, _Workspace] = {}


def _workspace(group_name: str) -> _Workspace:
    if group_name not in _workspaces:
        _workspaces[group_name] = _Workspace(get_group(group_name))
    return _workspaces[group_name]


def _path(t: torch.Tensor, group_name: str) -> str:
    """"lean" (TP=2 on CUDA), "fused" (PyTorch's symmetric-memory ops: CUDA at other TP
    sizes) or "plain" (a collective, then the matmuls: the CPU, and CUDA graph captures)."""
    world_size = get_group(group_name).world_size
    if not t.is_cuda or world_size == 1:
        return "plain"
    if torch.cuda.is_current_stream_capturing():
        # The lean path picks its slot on the host, so a replay would reuse the capture's;
        # PyTorch's ops cannot grow their workspace during a capture. NCCL's collectives can
        # be captured.
        if not _announced_capture:
            _announced_capture.append(True)
            logger.info("p2p collective matmuls: a CUDA graph is being captured (%d tokens); "
                        "the graph records NCCL collectives and plain matmuls there",
                        t.shape[0] * world_size)
        return "plain"
    return "lean" if world_size == 2 else "fused"


_announced_capture: list[bool] = []


@loom_op("all_gather_matmul_p2p", "(Tensor a, Tensor[] weights, int world_size, "
                                  "str group_name, bool keep_a) -> (Tensor, Tensor[])")
def all_gather_matmul_p2p(a: torch.Tensor, weights: list[torch.Tensor], world_size: int,
                          group_name: str, keep_a: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(all_gather(a) if keep_a else an empty [0, K] tensor, [all_gather(a) @ w ...])."""
    a = a.contiguous()
    path = _path(a, group_name)
    if path != "lean":
        return _all_gather_matmul_fallback(a, weights, world_size, group_name, keep_a,
                                           fused=path == "fused")
    ws = _workspace(group_name)
    mine, theirs = ws.slots("ag", tuple(a.shape), a.dtype, a.device)
    m = a.shape[0]
    rank = ws.handle.rank
    own, other = slice(rank * m, (rank + 1) * m), slice((1 - rank) * m, (2 - rank) * m)
    mine.copy_(a)
    ws.handle.barrier(channel=0)
    main, side = torch.cuda.current_stream(), ws.side_stream()
    gathered = a.new_empty((2 * m, a.shape[1]))
    side.wait_stream(main)
    with torch.cuda.stream(side):
        gathered[other].copy_(theirs)
    outs = [a.new_empty((2 * m, w.shape[1])) for w in weights]
    for out, w in zip(outs, weights):
        torch.mm(a, w, out=out[own])
    if keep_a:
        gathered[own].copy_(a)
    main.wait_stream(side)
    for out, w in zip(outs, weights):
        torch.mm(gathered[other], w, out=out[other])
    return (gathered if keep_a else a.new_empty((0, a.shape[1]))), outs


def _all_gather_matmul_fallback(a, weights, world_size, group_name, keep_a, fused):
    group = get_group(group_name)
    if fused:
        gathered, outs = torch.ops.symm_mem.fused_all_gather_matmul(
            a, weights, 0, group.c10d_name, return_A=True)
    else:
        gathered = a.new_empty((world_size * a.shape[0], a.shape[1]))
        if group.world_size == 1:
            gathered.copy_(a)
        else:
            dist.all_gather_into_tensor(gathered, a, group=group.group)
        outs = [gathered @ w for w in weights]
    return (gathered if keep_a else a.new_empty((0, a.shape[1]))), list(outs)


@all_gather_matmul_p2p.register_fake
def _(a, weights, world_size, group_name, keep_a):
    rows = world_size * a.shape[0]
    return (a.new_empty((rows if keep_a else 0, a.shape[1])),
            [a.new_empty((rows, w.shape[1])) for w in weights])


@loom_op("matmul_reduce_scatter_partials_p2p",
         "(Tensor a, Tensor b, int world_size, str group_name) -> Tensor")
def matmul_reduce_scatter_partials_p2p(a: torch.Tensor, b: torch.Tensor, world_size: int,
                                       group_name: str) -> torch.Tensor:
    """As `loom::matmul_reduce_scatter_partials`: [world_size, M / world_size, N], rank r's
    partial product for this rank's rows at index r."""
    path = _path(a, group_name)
    if path == "fused":
        return matmul_reduce_scatter_partials(a, b, world_size, group_name)
    if path == "plain":
        group = get_group(group_name)
        if group.world_size == 1:
            return (a @ b).unsqueeze(0)
        return partials_by_all_to_all(a, b, world_size, group)
    ws = _workspace(group_name)
    m, n = a.shape[0] // 2, b.shape[1]
    mine, theirs = ws.slots("rs", (m, n), a.dtype, a.device)
    rank = ws.handle.rank
    peer = 1 - rank
    out = a.new_empty((2, m, n))
    torch.mm(a[peer * m:(peer + 1) * m], b, out=mine)  # the peer's rows, for the peer to pull
    ws.handle.barrier(channel=0)
    main, side = torch.cuda.current_stream(), ws.side_stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        out[peer].copy_(theirs)  # the peer's partial for this rank's rows
    torch.mm(a[rank * m:(rank + 1) * m], b, out=out[rank])
    main.wait_stream(side)
    return out


@matmul_reduce_scatter_partials_p2p.register_fake
def _(a, b, world_size, group_name):
    return a.new_empty(world_size, a.shape[0] // world_size, b.shape[1])
