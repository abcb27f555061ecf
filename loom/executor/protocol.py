"""Messages between the multiprocess executor and its worker processes.

Typed msgspec Structs, encoded once per step and pushed to every rank: no pickle on the
step path. `CollectiveRPC` names a method from `Worker.RPC_METHODS`; the one way to run a
caller's code, LLM.collective_rpc of a function, passes it pickled to `call_function`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from loom.core.sched_output import ModelRunnerOutput, SchedulerOutput


class ExecuteModel(msgspec.Struct, tag="exec", array_like=True):
    """Launch a step. A rank replies with the previous step's output once this one is
    queued on its device, so reading back one step overlaps the device running the next."""
    scheduler_output: SchedulerOutput


class FlushOutput(msgspec.Struct, tag="flush", array_like=True):
    """Reply with the last launched step's output now (no next step is coming yet)."""


class CollectiveRPC(msgspec.Struct, tag="rpc", array_like=True):
    method: str
    args: list[Any] = []
    """Plain values (scalars, and lists and dicts of them), or bytes."""


class ShutdownWorker(msgspec.Struct, tag="shutdown", array_like=True):
    pass


WorkerCommand = ExecuteModel | FlushOutput | CollectiveRPC | ShutdownWorker


class WorkerReady(msgspec.Struct, tag="ready", array_like=True):
    rank: int


class RunnerOutput(msgspec.Struct, tag="out", array_like=True):
    output: ModelRunnerOutput


class RPCReply(msgspec.Struct, tag="reply", array_like=True):
    rank: int
    value: Any = None
    error: str | None = None
    """The call's ValueError, TypeError or NotImplementedError ("Kind: message"): bad input
    to one call, not a failed rank."""


class WorkerFailed(msgspec.Struct, tag="failed", array_like=True):
    rank: int
    error: str


WorkerMessage = WorkerReady | RunnerOutput | RPCReply | WorkerFailed
