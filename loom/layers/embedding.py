"""Vocabulary-parallel embedding and LM head.

The vocabulary is padded to a multiple of the TP size and split into contiguous ranges;
each rank embeds the ids in its range (zeros elsewhere) and an all-reduce completes the
rows. The LM head computes its range of logits and all-gathers them for sampling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loom import envs
from loom.distributed.ops import tp_all_gather, tp_all_reduce
from loom.distributed.parallel_state import get_tp_group


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank, tp.world_size
        self.vocab_size = vocab_size
        self.shard_size = -(-vocab_size // self.tp_size)
        self.start = self.tp_rank * self.shard_size
        self.weight = nn.Parameter(torch.empty(self.shard_size, hidden_size), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        if tuple(loaded.shape) != (self.vocab_size, param.shape[1]):  # as vLLM's loader
            raise ValueError(f"{type(self).__name__}: the checkpoint's tensor is "
                             f"{list(loaded.shape)}, the config (vocab_size, hidden_size) "
                             f"makes it {[self.vocab_size, param.shape[1]]}")
        rows = loaded[self.start:self.start + self.shard_size]
        param.data[:rows.shape[0]].copy_(rows)
        param.data[rows.shape[0]:].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        in_range = (local >= 0) & (local < self.shard_size)
        out = F.embedding(local.clamp(0, self.shard_size - 1), self.weight)
        out = out * in_range.unsqueeze(-1).to(out.dtype)
        return tp_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__(vocab_size, hidden_size)
        # The logits are computed eagerly, after the compiled forward, so the decode GEMV
        # pass never sees this matmul: decode batches take the Triton GEMV here where its
        # table has the shape (an H200: 233 against cuBLAS's ~244 us at TP=1).
        self._linear = F.linear
        if envs.decode_gemv():
            from loom.kernels.gemv_decode import linear
            self._linear = linear

    def tie_weights(self, embed: VocabParallelEmbedding) -> None:
        self.weight = embed.weight

    def compile_logits(self, hidden: torch.Tensor) -> bool:
        """Compile, running nothing (inside compile_pool, on its threads), the decode GEMV
        that compute_logits(hidden) would launch; False where it takes cuBLAS."""
        if self._linear is F.linear:
            return False
        from loom.kernels.gemv_decode import compile_linear
        return compile_linear(hidden, self.weight)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._linear(hidden, self.weight)
        if self.tp_size > 1:
            logits = tp_all_gather(logits, dim=-1)
        return logits[..., :self.vocab_size]
