"""What `LLM.generate` and `AsyncLLM.generate` return, shaped like vLLM's outputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]
"""token id -> Logprob at one position: the chosen token and the top-N alternatives."""


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    """stop, length, abort or error; None while running."""
    stop_reason: int | str | None = None
    """The stop token id or stop string that ended the request."""
    error: str | None = None
    """Why it ended with finish_reason error (a LoRA adapter that could not be loaded, a
    guided-decoding grammar that failed); the server answers such a request with an error."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    """None for the first prompt token (nothing precedes it), then one entry per token."""
    num_cached_tokens: int = 0
    metrics: dict = field(default_factory=dict)


@dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclass
class EmbeddingRequestOutput:
    """What `LLM.embed` and `AsyncLLM.encode` return (vLLM's names)."""
    request_id: str
    outputs: EmbeddingOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class ClassificationOutput:
    probs: list[float]
    """The class probabilities (vLLM's name): the logits through the model's activation
    (softmax, or sigmoid for one label), or the logits themselves with use_activation
    False."""

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass
class ClassificationRequestOutput:
    """What `LLM.classify` returns per prompt (vLLM's names)."""
    request_id: str
    outputs: ClassificationOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class ScoringOutput:
    score: float
    """Embedding models (bi-encoders): the cosine similarity of the pair's two embeddings,
    in [-1, 1]. Cross-encoders: the classifier's logit for the pair run as one sequence,
    through its activation (sigmoid: in (0, 1))."""


@dataclass
class ScoringRequestOutput:
    """What `LLM.score` returns per pair (vLLM's names). Bi-encoders: request_id joins the
    two embedding requests' ids; prompt_token_ids are the first text's, the pad token (where
    the tokenizer has one) and the second's, as vLLM reports them. Cross-encoders: the
    pair's one request, and the tokens it ran."""
    request_id: str
    outputs: ScoringOutput
    prompt_token_ids: list[int]
    finished: bool = True


@dataclass
class PoolingOutput:
    data: torch.Tensor
    """The pooler's output for the request's task, float32: an embedding, or class
    probabilities (logits with use_activation False)."""


@dataclass
class PoolingRequestOutput:
    """What `LLM.encode` returns per prompt (vLLM's names)."""
    request_id: str
    outputs: PoolingOutput
    prompt_token_ids: list[int]
    finished: bool = True
