"""The executor interface: how the engine core reaches its workers."""

from __future__ import annotations

import abc

from loom.config import EngineConfig
from loom.core.sched_output import ModelRunnerOutput, SchedulerOutput


class Executor(abc.ABC):
    max_steps_in_flight = 2
    """Steps the engine may launch before collecting the oldest (async scheduling)."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config

    @abc.abstractmethod
    def determine_num_blocks(self) -> int:
        """KV blocks every rank can hold (the minimum over ranks)."""

    @abc.abstractmethod
    def initialize_cache(self, num_blocks: int) -> None: ...

    @abc.abstractmethod
    def launch(self, so: SchedulerOutput) -> object:
        """Send one step to the workers without waiting; returns a token for collect()."""

    @abc.abstractmethod
    def collect(self, step: object) -> ModelRunnerOutput:
        """Wait for a launched step's output. Steps are collected in launch order."""

    @abc.abstractmethod
    def collective_rpc(self, method: str, *args) -> list:
        """Call a `Worker.RPC_METHODS` method on every rank; the results in rank order."""

    def shutdown(self) -> None:
        pass

    @property
    def model_info(self) -> dict:
        """vocab_size and max_model_len as the workers loaded them."""
        return {}

    @property
    def local_device(self):
        """The device of a worker that runs in this process (its kernels are queued on
        this process's streams); None where the workers are processes of their own."""
        return None


def make_executor(config: EngineConfig) -> Executor:
    if config.parallel.worker_processes:
        from loom.executor.multiproc import MultiprocExecutor
        return MultiprocExecutor(config)
    from loom.executor.uniproc import UniprocExecutor
    return UniprocExecutor(config)
