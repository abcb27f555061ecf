"""`PoolingParams`: what an embedding request asks of the engine instead of sampling.

A msgspec Struct, like `SamplingParams`, so that it crosses the API -> engine ZeroMQ
boundary unchanged. A pooling request runs its prompt through the model (prefill only) and
ends with one vector: the final-norm hidden states of its prompt rows, reduced.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from loom.sampling_params import check_truncation

PoolingType = Literal["last", "mean", "cls"]
POOLING_TYPES: tuple[str, ...] = ("last", "mean", "cls")


class PoolingParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    pooling_type: PoolingType = "last"
    """last: the last prompt token's hidden state (causal LMs as embedders, e.g.
    Qwen3-Embedding); mean: the average over the prompt; cls: the first token's."""
    normalize: bool = True
    """L2-normalise the pooled vector."""
    truncate_prompt_tokens: int | None = None
    """vLLM's: embed only the input's last k tokens (-1: as many as max_model_len)."""

    def __post_init__(self) -> None:
        check_truncation(self.truncate_prompt_tokens)
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type: must be one of {', '.join(POOLING_TYPES)}, "
                             f"got {self.pooling_type!r}")

    @property
    def needs_every_prompt_row(self) -> bool:
        """Whether the pooled vector depends on rows a prefix-cache hit would skip."""
        return self.pooling_type != "last"
