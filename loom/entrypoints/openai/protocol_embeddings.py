"""POST /v1/embeddings request and response bodies (pydantic), OpenAI's shape."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from loom.entrypoints.openai.protocol import RequestBody
from loom.entrypoints.openai.protocol_chat import ChatMessage, ChatTemplateFields
from loom.pooling_params import PoolingParams


class PoolingInputRequest(RequestBody, ChatTemplateFields):  # unknown fields ignored
    """What /v1/embeddings, /classify and /pooling share: inputs as text or token ids, or
    (vLLM's chat form) one conversation in `messages`, rendered by the chat template
    without a generation prompt unless asked."""

    input: str | list[str] | list[int] | list[list[int]] | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = False
    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    """vLLM's extension: pool only each input's last k tokens (-1: max_model_len of them)."""

    @model_validator(mode="after")
    def _one_input(self):
        if (self.input is None) == (self.messages is None):
            raise ValueError("input: give exactly one of input and messages")
        if self.messages is not None:
            if not self.messages:
                raise ValueError("messages: must hold at least one message")
            self.check_template_fields()
        return self

    @field_validator("input", mode="before")
    @classmethod
    def _input_shape(cls, value: Any) -> Any:
        # One clear message instead of one per member of the union.
        def token_ids(v: Any) -> bool:
            return (isinstance(v, list) and bool(v)
                    and all(type(t) is int and 0 <= t < 2**31 for t in v))
        ok = (isinstance(value, str)
              or (isinstance(value, list) and bool(value)
                  and (all(isinstance(p, str) for p in value) or token_ids(value)
                       or all(token_ids(p) for p in value))))
        if not ok:
            raise ValueError("must be a string, a non-empty list of strings, a list of token "
                             "ids (ints in [0, 2**31)) or a list of such lists")
        return value

    @property
    def inputs(self) -> list[str | list[int]]:
        """One entry per input: a string or a token-id list."""
        value = self.input
        if isinstance(value, str) or isinstance(value[0], int):
            return [value]
        return list(value)


class EmbeddingRequest(PoolingInputRequest):
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    normalize: bool | None = None
    """vLLM's extension: L2-normalise each vector (None: the server's default)."""

    def to_pooling_params(self) -> PoolingParams:
        """The model's matryoshka dimensions are checked by the Processor."""
        return PoolingParams(normalize=self.normalize, dimensions=self.dimensions,
                             truncate_prompt_tokens=self.truncate_prompt_tokens)


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str
    """Floats, or base64 of little-endian float32 when encoding_format is base64."""


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class PoolingListResponse(BaseModel):
    """The head every pooling API's response shares (embeddings, score, classify): then
    its `data` and `usage`."""
    id: str
    object: Literal["list"] = "list"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class EmbeddingResponse(PoolingListResponse):
    data: list[EmbeddingData]
    usage: EmbeddingUsage
