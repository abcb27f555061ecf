"""POST /pooling, vLLM's raw pooling API: per input the pooler's output for the model's task
(or the one the request names), as a list of floats or base64 float32. An embedding
model's is its embedding (`/v1/embeddings`' options), a classifier's its class
probabilities (`/classify`'s, raw logits with use_activation false)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from loom.entrypoints.openai.protocol import UsageInfo
from loom.entrypoints.openai.protocol_classify import ActivationFields, ClassificationRequest
from loom.entrypoints.openai.protocol_embeddings import (EmbeddingRequest, PoolingInputRequest,
                                                         PoolingListResponse)


class PoolingRequest(PoolingInputRequest, ActivationFields):
    task: Literal["embed", "classify"] | None = None
    """None: the model's own (classify for a classifier, else embed)."""
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    normalize: bool | None = None

    def _shared(self) -> dict:
        return dict(input=self.input, model=self.model, user=self.user,
                    truncate_prompt_tokens=self.truncate_prompt_tokens)

    def as_embedding(self) -> EmbeddingRequest:
        return EmbeddingRequest(**self._shared(), encoding_format=self.encoding_format,
                                dimensions=self.dimensions, normalize=self.normalize)

    def as_classification(self) -> ClassificationRequest:
        return ClassificationRequest(**self._shared(), use_activation=self.wants_activation)


class PoolingData(BaseModel):
    object: Literal["pooling"] = "pooling"
    index: int
    data: list[float] | str


class PoolingResponse(PoolingListResponse):
    data: list[PoolingData]
    usage: UsageInfo
