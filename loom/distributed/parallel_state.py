"""Process groups, one per parallel dimension, named by a string.

Collective custom ops name their group ("tp") rather than carry a ProcessGroup, so that
Dynamo traces each as one node and compile passes can match it. The registry below is
filled once per process by `init_distributed` and emptied by `destroy_distributed`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class GroupCoordinator:
    name: str
    rank: int
    world_size: int
    group: dist.ProcessGroup | None
    """None for a group of one: every collective is the identity."""


_GROUPS: dict[str, GroupCoordinator] = {}


def init_distributed(world_size: int, rank: int, init_method: str | None, backend: str) -> None:
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend, init_method=init_method, world_size=world_size, rank=rank)
    group = dist.group.WORLD if world_size > 1 else None
    _GROUPS["tp"] = GroupCoordinator("tp", rank, world_size, group)


def destroy_distributed() -> None:
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
