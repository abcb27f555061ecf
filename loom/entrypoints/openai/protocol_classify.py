"""POST /classify request and response bodies (pydantic), vLLM's shapes: inputs as
/v1/embeddings takes them; per input its class probabilities, the most likely class's label
(config.json's id2label) and the number of classes."""

from __future__ import annotations

from pydantic import BaseModel

from loom.entrypoints.openai.protocol import UsageInfo
from loom.entrypoints.openai.protocol_embeddings import PoolingInputRequest, PoolingListResponse
from loom.pooling_params import PoolingParams


class ActivationFields(BaseModel):
    """vLLM's switch between probabilities and raw logits, under its three names."""
    use_activation: bool | None = None
    """True (the default): softmax over the labels, sigmoid for one label (or what the
    model's config names); False: the logits as they are."""
    activation: bool | None = None
    softmax: bool | None = None
    """activation and softmax: the names vLLM deprecated for use_activation."""

    @property
    def wants_activation(self) -> bool | None:
        for value in (self.use_activation, self.activation, self.softmax):
            if value is not None:
                return value
        return None


class ClassificationRequest(PoolingInputRequest, ActivationFields):
    def to_pooling_params(self) -> PoolingParams:
        return PoolingParams(task="classify", use_activation=self.wants_activation,
                             truncate_prompt_tokens=self.truncate_prompt_tokens)


class ClassificationData(BaseModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(PoolingListResponse):
    data: list[ClassificationData]
    usage: UsageInfo
