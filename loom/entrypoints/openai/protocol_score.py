"""POST /score and /rerank request and response bodies (pydantic), vLLM's shapes: /score
takes two sides of texts under vLLM's names (text_1/text_2, or queries with documents or
items, or data_1/data_2); /rerank is Jina's and Cohere's query and documents."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from loom.entrypoints.openai.protocol import RequestBody, UsageInfo
from loom.entrypoints.openai.protocol_classify import ActivationFields
from loom.entrypoints.openai.protocol_embeddings import PoolingListResponse
from loom.pooling_params import PoolingParams

Texts = str | list[str]

SCORE_PAIRS: tuple[tuple[str, str], ...] = (
    ("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))
"""The names vLLM's ScoreRequest takes its two sides under, one pair per request."""


class ScoreRequest(RequestBody, ActivationFields):  # unknown fields ignored, as the others'
    model: str | None = None
    text_1: Texts | None = None
    text_2: Texts | None = None
    queries: Texts | None = None
    documents: Texts | None = None
    items: Texts | None = None
    data_1: Texts | None = None
    data_2: Texts | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    """vLLM's: embed only each text's last k tokens (-1: max_model_len of them); a
    cross-encoder keeps each pair's last k."""

    @model_validator(mode="after")
    def _one_pair(self) -> ScoreRequest:
        _sides(self)
        return self

    def texts(self) -> tuple[list[str], list[str]]:
        """The two sides' texts, whatever names they came under."""
        first, second = (getattr(self, name) for name in _sides(self))
        return _as_list(first), _as_list(second)

    @property
    def side_names(self) -> tuple[str, str]:
        return _sides(self)

    def to_pooling_params(self) -> PoolingParams:
        return _pooling_params(self)


class RerankRequest(RequestBody, ActivationFields):
    model: str | None = None
    query: str
    documents: list[str] = Field(min_length=1)
    top_n: int = Field(default=0, ge=0)
    """The best top_n results only; 0 (vLLM's default): all of them."""
    return_documents: bool = True
    """Jina's and Cohere's: each result carries its document's text (vLLM's always do)."""
    user: str | None = None
    truncate_prompt_tokens: int | None = None

    def to_pooling_params(self) -> PoolingParams:
        return _pooling_params(self)


def _pooling_params(body: ScoreRequest | RerankRequest) -> PoolingParams:
    """use_activation applies to cross-encoders' scores (a cosine has no activation)."""
    return PoolingParams(truncate_prompt_tokens=body.truncate_prompt_tokens,
                         use_activation=body.wants_activation)


def _sides(body: ScoreRequest) -> tuple[str, str]:
    """The names of the two fields the request's texts are under: one whole pair."""
    given = [name for name in dict.fromkeys(n for pair in SCORE_PAIRS for n in pair)
             if getattr(body, name) is not None]
    for pair in SCORE_PAIRS:
        if set(given) == set(pair):
            return pair
    if not given:
        raise ValueError("text_1: required, with text_2 (or vLLM's queries with documents)")
    if len(given) == 1:
        partner = next(b if a == given[0] else a for a, b in SCORE_PAIRS if given[0] in (a, b))
        raise ValueError(f"{partner}: required with {given[0]}")
    raise ValueError(f"{given[1]}: cannot be sent with {given[0]}; give one pair of "
                     "text_1/text_2, queries/documents, queries/items or data_1/data_2")


def _as_list(texts: Texts) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


class ScoreResponseData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreResponse(PoolingListResponse):
    data: list[ScoreResponseData]
    usage: UsageInfo


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    document: RerankDocument | None = None
    """Left out with return_documents false."""
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(BaseModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
