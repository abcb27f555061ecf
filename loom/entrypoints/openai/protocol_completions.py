"""POST /v1/completions request and response bodies (pydantic)."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field, StrictBool, field_validator, model_validator

from loom.entrypoints.openai.protocol import (MAX_LOGPROBS, PromptLogprobs, SamplingFields,
                                              TokenId, UsageInfo)
from loom.sampling_params import SamplingParams


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: int | None = Field(16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    suffix: str | None = None
    request_id: str | None = Field(None, min_length=1, max_length=256)
    """vLLM's: the id's base (`cmpl-<it>`, `chatcmpl-<it>`); an X-Request-Id header wins."""
    return_token_ids: StrictBool | None = None
    """vLLM's: each choice carries its prompt's token ids and its own generated ones."""

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, value: Any) -> Any:
        # One clear message instead of one per member of the union.
        def token_ids(v: Any) -> bool:
            return isinstance(v, list) and all(type(t) is int and 0 <= t < 2**31 for t in v)
        ok = (isinstance(value, str)
              or (isinstance(value, list) and (all(isinstance(p, str) for p in value)
                                                or token_ids(value)
                                                or all(token_ids(p) for p in value))))
        if not ok:
            raise ValueError("must be a string, a list of strings, a list of token ids "
                             "(ints in [0, 2**31)) or a list of such lists")
        if isinstance(value, list) and not value:
            raise ValueError("must not be empty")
        return value

    @model_validator(mode="after")
    def _check_prompt(self):
        if self.suffix:
            raise ValueError("suffix: not supported by loom")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a string or a token-id list."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)

    def to_sampling_params(self, max_tokens: int,
                           defaults: dict[str, Any] | None = None) -> SamplingParams:
        prompt_logprobs = self.prompt_logprobs
        if self.echo and self.logprobs is not None:  # the echoed prompt's own logprobs
            if prompt_logprobs is not None:
                raise ValueError("prompt_logprobs: echo with logprobs already returns the "
                                 "prompt's logprobs; give one or the other")
            prompt_logprobs = self.logprobs
        return self._sampling(max_tokens, self.logprobs, prompt_logprobs, defaults or {})


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = []
    token_logprobs: list[float | None] = []
    tokens: list[str] = []
    top_logprobs: list[dict[str, float] | None] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    """return_token_ids: the prompt as the engine ran it (a stream: in a choice's first chunk)."""
    token_ids: list[int] | None = None
    """return_token_ids: the generated ids (a stream: those this chunk adds), echo or not."""


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
