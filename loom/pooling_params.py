"""`PoolingParams`: what an embedding or classification request asks of the engine instead
of sampling.

A msgspec Struct, like `SamplingParams`, so that it crosses the API -> engine ZeroMQ
boundary unchanged. A pooling request runs its prompt through the model (prefill only) and
ends with one vector: for task embed, the final-norm hidden states of its prompt rows,
reduced; for classify and score, a classifier's logits at its last token.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from loom.config_checks import check_bools
from loom.sampling_params import check_truncation

PoolingType = Literal["last", "mean", "cls"]
POOLING_TYPES: tuple[str, ...] = ("last", "mean", "cls")
PoolingTask = Literal["embed", "classify", "score"]
"""vLLM's pooling tasks: embed (hidden states), classify (a classifier's logits), score (a
cross-encoder's logit for a query and document run as one sequence)."""
POOLING_TASKS: tuple[str, ...] = ("embed", "classify", "score")


class PoolingParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    pooling_type: PoolingType = "last"
    """last: the last prompt token's hidden state (causal LMs as embedders, e.g.
    Qwen3-Embedding); mean: the average over the prompt; cls: the first token's."""
    normalize: bool | None = None
    """L2-normalise the pooled vector; None: the server's default (--pooler-config's
    normalize, else true)."""
    truncate_prompt_tokens: int | None = None
    """vLLM's: embed only the input's last k tokens (-1: as many as max_model_len)."""
    task: PoolingTask = "embed"
    """What the engine returns: set by `LLM.embed`, `classify` and `score` and by the
    server's endpoints; the engine refuses a task its model does not serve."""
    dimensions: int | None = None
    """OpenAI's, for embed: keep the vector's first `dimensions` values (a matryoshka
    model's, `loom.tasks.check_dimensions`), then normalise; None: the server's default
    (--pooler-config's dimensions), else all of them."""
    use_activation: bool | None = None
    """vLLM's, for classify and score: softmax or sigmoid over the logits (or what the
    model's config names), as vLLM applies them; False: the raw logits. None: True."""

    def __post_init__(self) -> None:
        check_truncation(self.truncate_prompt_tokens)
        check_bools({"normalize": self.normalize, "use_activation": self.use_activation},
                    optional=True)
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type: must be one of {', '.join(POOLING_TYPES)}, "
                             f"got {self.pooling_type!r}")
        if self.task not in POOLING_TASKS:
            raise ValueError(f"task: must be one of {', '.join(POOLING_TASKS)}, "
                             f"got {self.task!r}")
        if self.dimensions is not None and (isinstance(self.dimensions, bool)
                                            or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"dimensions: must be a positive integer, got {self.dimensions!r}")
        if self.dimensions is not None and self.task != "embed":
            raise ValueError(f"dimensions: only embeddings have them, not {self.task}")
        if self.task != "embed" and self.pooling_type != "last":
            raise ValueError(f"pooling_type: a classifier reads its last token (transformers' "
                             f"rule), so {self.task} takes only 'last', got "
                             f"{self.pooling_type!r}")

    @property
    def needs_every_prompt_row(self) -> bool:
        """Whether the pooled vector depends on rows a prefix-cache hit would skip."""
        return self.pooling_type != "last"
