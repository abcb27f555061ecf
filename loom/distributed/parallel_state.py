"""Process groups, one per parallel dimension, named by a string.

Collective custom ops name their group ("tp") rather than carry a ProcessGroup, so that
Dynamo traces each as one node and compile passes can match it. The registry below is
filled once per process by `init_distributed` and emptied by `destroy_distributed`.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class GroupCoordinator:
    name: str
    rank: int
    world_size: int
    group: dist.ProcessGroup | None
    """None for a group of one: every collective is the identity."""

    @property
    def c10d_name(self) -> str | None:
        """The process group's c10d name, which torch's own collective ops (symmetric
        memory's fused matmuls) take instead of our string; None for a group of one."""
        return self.group.group_name if self.group is not None else None


_GROUPS: dict[str, GroupCoordinator] = {}


def init_distributed(world_size: int, rank: int, init_method: str | None, backend: str) -> None:
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank)
    group = dist.group.WORLD if world_size > 1 else None
    _GROUPS["tp"] = GroupCoordinator("tp", rank, world_size, group)


def destroy_distributed() -> None:
    from loom.distributed.ops import release_small_all_reduce
    release_small_all_reduce()
    _GROUPS.clear()
    if dist.is_initialized():
        dist.destroy_process_group()


def get_group(name: str) -> GroupCoordinator:
    try:
        return _GROUPS[name]
    except KeyError:
        # A model built outside an engine (tests, scripts) runs on one device.
        return GroupCoordinator(name, 0, 1, None)


def get_tp_group() -> GroupCoordinator:
    return get_group("tp")


@contextlib.contextmanager
def tp_alone():
    """Within it, this rank is a TP group of its own: a model built and run here is whole
    and calls no collective (the driver's draft model beside a sharded target)."""
    saved = _GROUPS.get("tp")
    _GROUPS["tp"] = GroupCoordinator("tp", 0, 1, None)
    try:
        yield
    finally:
        if saved is None:
            _GROUPS.pop("tp", None)
        else:
            _GROUPS["tp"] = saved


def enable_symmetric_memory(name: str) -> None:
    """Register a group with torch symmetric memory, which the async-TP fused matmuls
    (`torch.ops.symm_mem.*`) rendezvous through. CUDA only."""
    import warnings

    from torch.distributed import _symmetric_memory as symm_mem
    c10d_name = get_group(name).c10d_name
    if c10d_name is None or symm_mem.is_symm_mem_enabled_for_group(c10d_name):
        return
    with warnings.catch_warnings():
        # Newer torch deprecates the call as unneeded; older releases still need it.
        warnings.simplefilter("ignore", FutureWarning)
        symm_mem.enable_symm_mem_for_group(c10d_name)
