"""A worker extension as RL trainers give vLLM (worker_extension_cls): methods that load a
trainer's weights into each rank, called through collective_rpc."""

import torch


class WeightSync:
    def load_state_dict_file(self, path: str) -> int:
        """The whole (unsharded) state dict saved at path; each rank keeps its shard."""
        self.update_weights(list(torch.load(path, weights_only=True).items()))
        return self.rank

    def weight_sum(self, name: str) -> float:
        return float(self.model_runner.model.get_parameter(name).float().sum())


class Clashing:
    def sleep(self) -> None:  # the worker's own
        pass
