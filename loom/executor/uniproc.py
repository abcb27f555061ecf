"""One worker in the engine core's own process."""

from __future__ import annotations

import torch

from loom.config import EngineConfig
from loom.core.sched_output import ModelRunnerOutput, SchedulerOutput
from loom.distributed.parallel_state import destroy_distributed
from loom.executor.base import Executor
from loom.worker.step_handle import StepHandle
from loom.worker.worker import Worker


class UniprocExecutor(Executor):
    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.worker = Worker(config)

    def determine_num_blocks(self) -> int:
        return self.worker.determine_num_blocks()

    def initialize_cache(self, num_blocks: int) -> None:
        self.worker.initialize_cache(num_blocks)

    def launch(self, so: SchedulerOutput) -> StepHandle:
        return self.worker.launch(so)

    def collect(self, step: StepHandle) -> ModelRunnerOutput:
        return step.output()

    def collective_rpc(self, method: str, *args) -> list:
        return [self.worker.rpc(method, list(args))]

    def shutdown(self) -> None:
        # Release the model and KV cache now, not when the caller drops the LLM.
        if self.worker is None:
            return  # already shut down
        device = self.worker.device
        self.worker = None
        destroy_distributed()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    @property
    def model_info(self) -> dict:
        return self.worker.model_info()

    @property
    def local_device(self) -> torch.device:
        return self.worker.device
