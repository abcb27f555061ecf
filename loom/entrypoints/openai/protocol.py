"""OpenAI request and response bodies (pydantic), and their mapping onto SamplingParams:
what every request shares, and /v1/models (completions in `protocol_completions`, chat and
/tokenize in `protocol_chat`, embeddings in `protocol_embeddings`).

Requests accept OpenAI's fields plus vLLM's extensions (top_k, min_p, repetition_penalty,
min_tokens, ignore_eos, guided_json, ...). Unknown fields are ignored, as OpenAI's SDKs send
some that do not apply here. Features loom lacks (best_of > n, and vLLM's
extensions in `UNSUPPORTED_EXTENSIONS`) are refused with a 400 rather than silently ignored.
"""

from __future__ import annotations

import re
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from loom.beam_search import BeamSearchParams
from loom.sampling_params import GuidedDecodingParams, SamplingParams

MAX_N = 128
SAMPLING_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""The fields a model's generation_config.json may default for the server's requests."""
MAX_LOGPROBS = 2**31 - 1
"""The most top logprobs a request body may name at all. How many a server grants is its
--max-logprobs (vLLM's default 20), which the frontend's Processor checks, naming the field."""

Int64 = Annotated[int, Field(ge=-(2**63), lt=2**63)]
TokenId = Annotated[int, Field(ge=0, lt=2**31)]
Float = Annotated[float, Field(allow_inf_nan=False)]


class OpenAIModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


UNSUPPORTED_EXTENSIONS = ("logits_processors",)
"""vLLM's request fields that change the output and that loom does not implement: a request
setting one gets a 400 naming it, where ignoring it would answer something else."""


def refuse_extensions(data: Any, names: tuple[str, ...]) -> None:
    """A 400 for the first of `names` the raw body sets (None and false count as unset)."""
    if not isinstance(data, dict):
        return
    for name in names:
        if data.get(name) not in (None, False):
            raise ValueError(f"{name}: not supported by loom")


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate_path(value: Any, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Where the first string holding a lone UTF-16 surrogate sits in a decoded JSON body.
    JSON may spell one ("\\ud800"), but it is not Unicode text: no tokenizer takes it and
    UTF-8 cannot encode it."""
    if isinstance(value, str):
        return path if _LONE_SURROGATE.search(value) else None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if isinstance(key, str) and _LONE_SURROGATE.search(key):
            return (*path, key)
        found = lone_surrogate_path(item, (*path, str(key)))
        if found is not None:
            return found
    return None


class RequestBody(OpenAIModel):
    """A request's top-level body: its strings must be valid Unicode."""

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        path = lone_surrogate_path(data)
        if path is not None:
            raise ValueError(f"{'.'.join(path) or 'body'}: holds a lone UTF-16 surrogate, "
                             "which is not valid Unicode text")
        return data


# -- errors -----------------------------------------------------------------------------------

class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


# -- shared request fields --------------------------------------------------------------------

class StreamOptions(OpenAIModel):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(OpenAIModel):
    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and (self.json_schema is None
                                           or self.json_schema.json_schema is None):
            raise ValueError("response_format: type json_schema needs json_schema.schema")
        return self


class StructuredOutputs(OpenAIModel):
    """vLLM's `structured_outputs` (its guided_* fields' replacement since vLLM 0.12): one
    constraint, as GuidedDecodingParams. Its switches match loom's one behaviour (compact
    JSON, objects closed to undeclared keys, no fallback backend) and are accepted as such."""
    json_schema: str | dict[str, Any] | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_fallback: bool = False
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported(cls, data: Any) -> Any:
        try:
            refuse_extensions(data, ("whitespace_pattern", "structural_tag"))
        except ValueError as e:
            raise ValueError(f"structured_outputs.{e}") from None
        return data

    @model_validator(mode="after")
    def _one_given(self):
        if all(v in (None, False) for v in (self.json_schema, self.regex, self.choice,
                                            self.grammar, self.json_object)):
            raise ValueError("structured_outputs: set one of json, regex, choice, grammar, "
                             "json_object")
        return self


class GuidedFields(OpenAIModel):
    """Structured output: OpenAI's response_format, vLLM's structured_outputs and its older
    guided_* fields, one at a time."""
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    def guided_decoding(self) -> GuidedDecodingParams | None:
        given = [(name, kind, value) for name, kind, value in self._guided_candidates()
                 if value is not None]
        if len(given) > 1:
            names = ", ".join(name for name, _, _ in given)
            raise ValueError(f"{given[0][0]}: give only one kind of structured output "
                             f"(got {names})")
        if not given:
            return None
        name, kind, value = given[0]
        try:
            return GuidedDecodingParams(**{kind: value})
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None

    def _guided_candidates(self) -> list[tuple[str, str, Any]]:
        fmt = self.response_format
        fmt_type = fmt.type if fmt is not None else "text"
        return [
            ("response_format", "json_object", True if fmt_type == "json_object" else None),
            ("response_format", "json",
             fmt.json_schema.json_schema if fmt_type == "json_schema" else None),
            *self._structured_candidates(),
            ("guided_json", "json", self.guided_json),
            ("guided_regex", "regex", self.guided_regex),
            ("guided_choice", "choice", self.guided_choice),
            ("guided_grammar", "grammar", self.guided_grammar),
        ]

    def _structured_candidates(self) -> list[tuple[str, str, Any]]:
        so = self.structured_outputs
        if so is None:
            return []
        values = dict(json=so.json_schema, regex=so.regex, choice=so.choice,
                      grammar=so.grammar, json_object=so.json_object or None)
        return [(f"structured_outputs.{kind}", kind, value) for kind, value in values.items()]


NULL_IS_DEFAULT = frozenset({"n", "stream", "echo", "logprobs"})
"""Fields OpenAI's spec lets a request send as null, meaning their default (the openai
client sends null for an argument given as None)."""


class SamplingFields(RequestBody, GuidedFields):
    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    temperature: Float | None = None
    top_p: Float | None = None
    top_k: Int64 | None = None
    min_p: Float | None = None
    presence_penalty: Float | None = None
    frequency_penalty: Float | None = None
    repetition_penalty: Float | None = None
    seed: Int64 | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    min_tokens: int = Field(0, ge=0, lt=2**31)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, Float] | None = None
    """OpenAI's: {token id (as JSON keys are, a string): bias in [-100, 100]}."""
    allowed_token_ids: list[TokenId] | None = None
    truncate_prompt_tokens: int | None = None
    """vLLM's: keep only the prompt's last k tokens (-1: as many as max_model_len)."""
    bad_words: list[str] | None = None
    """vLLM's: words never generated (at the start of the text or after a space)."""
    cache_salt: str | None = None
    """vLLM's: only requests with the same salt share cached prompt prefixes."""
    priority: Int64 = 0
    """vLLM's: lower is served first (--scheduling-policy priority; else only 0)."""
    use_beam_search: bool = False
    """vLLM's: beam search over n beams (`loom.beam_search`); whole responses only."""
    length_penalty: Float = 1.0
    """Beam search's: beams rank by cum_logprob / length ** length_penalty."""
    return_tokens_as_token_ids: bool | None = None
    """vLLM's: logprobs name their tokens "token_id:<id>" (text need not round-trip); unset:
    the server's --return-tokens-as-token-ids."""
    user: str | None = None
    prompt_logprobs: int | None = Field(None, ge=0)
    """vLLM's: the top logprobs at each prompt position (and the prompt token's own)."""
    vllm_xargs: dict[str, str | Int64 | Float | list[str | Int64 | Float]] | None = None
    """vLLM's: arguments for the server's custom logits processors (--logits-processors),
    SamplingParams.extra_args."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_extensions(cls, data: Any) -> Any:
        refuse_extensions(data, UNSUPPORTED_EXTENSIONS)
        if isinstance(data, dict):  # OpenAI's spec: null stands for the default here
            data = {k: v for k, v in data.items() if v is not None or k not in NULL_IS_DEFAULT}
        return data

    @model_validator(mode="after")
    def _refuse_unsupported(self):
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of: only best_of == n is supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when stream is true")
        if self.prompt_logprobs is not None and self.stream:
            raise ValueError("prompt_logprobs: not available when stream is true (as in vLLM)")
        if self.use_beam_search:
            asked = [name for name, on in (
                ("stream", self.stream),
                ("logprobs", getattr(self, "logprobs") not in (None, False)),
                ("prompt_logprobs", self.prompt_logprobs is not None)) if on]
            if asked:
                raise ValueError(f"use_beam_search: not supported by loom with {asked[0]}")
        return self

    def beam_search_params(self, max_tokens: int) -> BeamSearchParams:
        if self.guided_decoding() is not None:
            raise ValueError("use_beam_search: not supported by loom with structured output")
        return BeamSearchParams(beam_width=self.n, max_tokens=max_tokens,
                                ignore_eos=self.ignore_eos,
                                temperature=0.0 if self.temperature is None else self.temperature,
                                length_penalty=self.length_penalty,
                                include_stop_str_in_output=self.include_stop_str_in_output)

    def _sampling(self, max_tokens: int | None, logprobs: int | None,
                  prompt_logprobs: int | None, defaults: dict[str, Any]) -> SamplingParams:
        """defaults: the model's generation_config recommendations for what the request
        leaves unset (temperature, top_p, top_k, min_p, repetition_penalty)."""
        optional = {k: v for k, v in defaults.items() if k in SAMPLING_DEFAULT_FIELDS}
        optional |= {k: v for k, v in {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "min_p": self.min_p, "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "repetition_penalty": self.repetition_penalty}.items() if v is not None}
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            n=self.n, seed=self.seed, stop=stop, stop_token_ids=list(self.stop_token_ids or []),
            max_tokens=max_tokens, min_tokens=self.min_tokens, ignore_eos=self.ignore_eos,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=self._logit_bias(), allowed_token_ids=self.allowed_token_ids,
            truncate_prompt_tokens=self.truncate_prompt_tokens, bad_words=self.bad_words or [],
            guided_decoding=self.guided_decoding(), extra_args=self.vllm_xargs, **optional)

    def _logit_bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        try:
            return {int(token): bias for token, bias in self.logit_bias.items()}
        except ValueError:
            raise ValueError("logit_bias: keys must be token ids") from None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """vLLM's stream_options.continuous_usage_stats: usage so far on every chunk too."""
        return self.include_usage and self.stream_options.continuous_usage_stats


# -- shared response parts --------------------------------------------------------------------

class PromptLogprob(BaseModel):
    """vLLM's prompt_logprobs entry: {token id: this} at each prompt position but the first."""
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PromptLogprobs = list[dict[int, PromptLogprob] | None]


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0
    """Prompt tokens served from the prefix cache."""


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    """vLLM's --enable-prompt-tokens-details; None without it."""

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int,
           cached_tokens: int | None = None) -> UsageInfo:
        """cached_tokens: None leaves prompt_tokens_details out."""
        details = None if cached_tokens is None else PromptTokensDetails(
            cached_tokens=cached_tokens)
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens, prompt_tokens_details=details)


# -- models -----------------------------------------------------------------------------------

class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "loom"
    root: str | None = None
    parent: str | None = None
    """A LoRA adapter's base model (vLLM's field); None for a base model."""
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class LoadLoRAAdapterRequest(RequestBody):
    """POST /v1/load_lora_adapter (vLLM's, with LOOM_ALLOW_RUNTIME_LORA_UPDATING)."""
    lora_name: Annotated[str, Field(min_length=1)]
    lora_path: Annotated[str, Field(min_length=1)]


class UnloadLoRAAdapterRequest(RequestBody):
    """POST /v1/unload_lora_adapter; vLLM's lora_int_id is accepted and not needed."""
    lora_name: Annotated[str, Field(min_length=1)]
    lora_int_id: int | None = None
