"""Collectives as torch custom ops (`torch.ops.loom.*`) with fake implementations.

Each takes its group by name so that a traced graph holds one node per collective.
A group of one makes each op the identity (all_reduce copies so the op is functional).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from loom.distributed.parallel_state import enable_symmetric_memory, get_group
from loom.library import loom_op


_SYMM_BUFFERS: dict[str, torch.Tensor] = {}
"""group name -> a flat symmetric-memory buffer for one-shot all-reduces (CUDA, TP > 1)."""
_NORM_BUFFERS: dict = {}
"""group name -> the `SymmetricNormBuffer` of `all_reduce_add_rms_norm` (CUDA, TP > 1)."""
FUSED_NORM_MAX_ROWS = 64
"""Batches up to this many tokens take the one-kernel all-reduce + add + RMSNorm."""


def init_small_all_reduce(group_name: str, dtype: torch.dtype, device: torch.device,
                          disabled: bool = False) -> bool:
    """Allocate and rendezvous the group's symmetric buffer (every rank together, before
    any CUDA graph is captured). Small all-reduces then take one kernel that reads every
    peer's buffer over NVLink (P2P, no multicast) instead of NCCL, whose ~13 us latency
    per call dominates a decode step. Returns False where it cannot apply, or disabled
    (vLLM's --disable-custom-all-reduce: every all-reduce through NCCL)."""
    from loom import envs
    if disabled:
        return False
    group = get_group(group_name)
    max_bytes = envs.symm_all_reduce_max_bytes()
    if (group.world_size == 1 or device.type != "cuda" or max_bytes <= 0
            or dtype not in (torch.bfloat16, torch.float32)):
        return False
    from torch.distributed import _symmetric_memory as symm_mem
    enable_symmetric_memory(group_name)
    buf = symm_mem.empty(max_bytes // dtype.itemsize, dtype=dtype, device=device)
    symm_mem.rendezvous(buf, group.c10d_name)
    _SYMM_BUFFERS[group_name] = buf
    from loom.kernels.all_reduce_norm import SymmetricNormBuffer
    _NORM_BUFFERS[group_name] = SymmetricNormBuffer(group.c10d_name, device, group.group)
    return True


def release_small_all_reduce() -> None:
    _SYMM_BUFFERS.clear()
    _NORM_BUFFERS.clear()


@loom_op("all_reduce", "(Tensor x, str group_name) -> Tensor")
def all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    group = get_group(group_name)
    if group.world_size == 1:
        return x.clone()
    buf = _SYMM_BUFFERS.get(group_name)
    if buf is not None and x.dtype == buf.dtype and x.numel() <= buf.numel():
        return torch.ops.symm_mem.one_shot_all_reduce_copy(
            buf[:x.numel()].view(x.shape), x.contiguous(), "sum", group.c10d_name)
    out = x.clone()
    dist.all_reduce(out, group=group.group)
    return out


@all_reduce.register_fake
def _(x, group_name):
    return torch.empty_like(x)


@loom_op("all_reduce_add_rms_norm", "(Tensor x, Tensor residual, Tensor weight, float eps, "
                                    "str group_name) -> (Tensor, Tensor)")
def all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float, group_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm(all_reduce(x), residual)`: (normalised, new residual). Small
    batches on CUDA take one kernel for all of it (`kernels/all_reduce_norm.py`); larger
    ones the all-reduce, then one add + RMSNorm kernel."""
    norm_buffer = _NORM_BUFFERS.get(group_name)
    if norm_buffer is not None and x.dtype == residual.dtype and norm_buffer.fits(x):
        return norm_buffer.all_reduce_add_rms_norm(x, residual, weight, eps)
    reduced = all_reduce(x, group_name)
    if reduced.is_cuda:
        from loom.kernels.all_reduce_norm import add_rms_norm
        return add_rms_norm(reduced, residual, weight, eps)
    from loom.layers.norm import fused_add_rms_norm_op
    return fused_add_rms_norm_op(reduced, residual, weight, eps)


@all_reduce_add_rms_norm.register_fake
def _(x, residual, weight, eps, group_name):
    return (x.new_empty(x.shape, dtype=torch.promote_types(weight.dtype, x.dtype)),
            x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, residual.dtype)))


@loom_op("all_gather", "(Tensor x, int dim, int world_size, str group_name) -> Tensor")
def all_gather(x: torch.Tensor, dim: int, world_size: int, group_name: str) -> torch.Tensor:
    """Concatenate every rank's x along dim."""
    group = get_group(group_name)
    if group.world_size == 1:
        return x.clone()
    x = x.movedim(dim, 0).contiguous()
    out = x.new_empty((world_size * x.shape[0],) + tuple(x.shape[1:]))
    dist.all_gather_into_tensor(out, x, group=group.group)
    return out.movedim(0, dim).contiguous()


@all_gather.register_fake
def _(x, dim, world_size, group_name):
    shape = list(x.shape)
    shape[dim] *= world_size
    return x.new_empty(shape)


@loom_op("reduce_scatter",
         "(Tensor x, int dim, int world_size, str group_name) -> Tensor")
def reduce_scatter(x: torch.Tensor, dim: int, world_size: int, group_name: str) -> torch.Tensor:
    """Sum over ranks, then keep this rank's 1/world_size slice of dim."""
    group = get_group(group_name)
    if group.world_size == 1:
        return x.clone()
    x = x.movedim(dim, 0).contiguous()
    out = x.new_empty((x.shape[0] // world_size,) + tuple(x.shape[1:]))
    dist.reduce_scatter_tensor(out, x, group=group.group)
    return out.movedim(0, dim).contiguous()


@reduce_scatter.register_fake
def _(x, dim, world_size, group_name):
    shape = list(x.shape)
    shape[dim] //= world_size
    return x.new_empty(shape)


def tp_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if get_group("tp").world_size == 1:
        return x
    return torch.ops.loom.all_reduce(x, "tp")


def tp_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    world = get_group("tp").world_size
    if world == 1:
        return x
    return torch.ops.loom.all_gather(x, dim % x.dim(), world, "tp")
