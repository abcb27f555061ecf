"""POST /v1/responses request body (pydantic): OpenAI's Responses fields and vLLM's sampling
extensions, mapped onto what a chat request runs with (messages, tools in chat's shape,
tool_choice, structured output, SamplingParams). The response objects and stream events are
in `protocol_responses_output`.

`truncation: "auto"` is vLLM's: a rendered prompt past the context keeps its last
max_model_len - max_output_tokens tokens (all but one, max_output_tokens unset).

What loom cannot do is refused with a 400 naming the field, never ignored: built-in tools
(web_search, file_search, mcp, ...), `prompt` templates, `conversation`,
`include` values other than `message.output_text.logprobs`, and chat's fields that have
no Responses meaning (`n`, beam search, `prompt_logprobs`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from loom.entrypoints.openai.protocol import (MAX_LOGPROBS, OpenAIModel, SamplingFields,
                                              refuse_extensions)
from loom.entrypoints.openai.protocol_chat import ChatMessage
from loom.entrypoints.openai.responses_input import to_messages
from loom.entrypoints.openai.tool_calls import with_tool_constraint
from loom.sampling_params import GuidedDecodingParams, SamplingParams

LOGPROBS_INCLUDE = "message.output_text.logprobs"
_REFUSED = ("prompt", "conversation", "n", "best_of", "use_beam_search",
            "prompt_logprobs", "response_format")
"""Fields refused when set: what loom lacks (prompt templates, the
Conversations API) and chat's fields with no Responses meaning (use text.format for
response_format)."""


class FunctionTool(OpenAIModel):
    """A Responses function tool: chat's `function` members, flattened."""
    type: Literal["function"]
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def for_chat(self) -> dict[str, Any]:
        """The tool in chat's shape, as the template and tool_calls take it."""
        fn = {k: v for k, v in (("name", self.name), ("description", self.description),
                                ("parameters", self.parameters), ("strict", self.strict))
              if v is not None}
        return {"type": "function", "function": fn}


class TextFormat(OpenAIModel):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("text.format: type json_schema needs a schema")
        return self


class TextConfig(OpenAIModel):
    format: TextFormat = Field(default_factory=lambda: TextFormat(type="text"))
    verbosity: Literal["medium"] | None = None
    """Only OpenAI's default: loom has no way to make a model terser or wordier."""


class ReasoningConfig(OpenAIModel):
    """Accepted as vLLM does: `effort` reaches the chat template as `reasoning_effort`; the
    thinking itself is split off by the server's --reasoning-parser."""
    effort: str | None = None
    summary: str | None = None


class ResponseStreamOptions(OpenAIModel):
    include_obfuscation: bool | None = None
    """Accepted: loom's events carry no obfuscation padding to turn off."""


class ResponsesRequest(SamplingFields):
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1, lt=2**31)
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    """Generate it in the background (`responses_background`); it must be stored."""
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    metadata: dict[str, str] | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    max_tool_calls: int | None = Field(None, ge=1)
    """Echoed: it bounds built-in tool calls, which loom does not have."""
    stream_options: ResponseStreamOptions | None = None  # type: ignore[assignment]
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's chat extension: more variables for the chat template."""
    _messages: list[ChatMessage] = PrivateAttr(default_factory=list)
    _chat_tool_choice: str | dict[str, Any] = PrivateAttr("auto")

    @model_validator(mode="before")
    @classmethod
    def _refuse_unsupported_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("n") == 1:
            data = {k: v for k, v in data.items() if k != "n"}
        refuse_extensions(data, _REFUSED)
        tools = data.get("tools") if isinstance(data, dict) else None
        for i, tool in enumerate(tools if isinstance(tools, list) else []):
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise ValueError(f"tools.{i}.type: {kind!r} tools are not supported by loom "
                                 "(only function tools; built-in tools are not)")
        return data

    @model_validator(mode="after")
    def _check_responses(self):
        self._messages = [ChatMessage.model_validate(m) for m in to_messages(self.input)]
        if not self._messages and self.previous_response_id is None:
            raise ValueError("input: must not be empty")
        for i, name in enumerate(self.include or []):
            if name != LOGPROBS_INCLUDE:
                raise ValueError(f"include.{i}: {name!r} is not supported by loom (only "
                                 f"{LOGPROBS_INCLUDE!r})")
        if self.top_logprobs and not self.wants_logprobs:
            raise ValueError(f"top_logprobs: needs include [{LOGPROBS_INCLUDE!r}]")
        _check_metadata(self.metadata)
        self._chat_tool_choice = self._tool_choice_for_chat()
        return self

    @property
    def messages(self) -> list[ChatMessage]:
        """The input as chat messages (instructions and earlier turns not included)."""
        return self._messages

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or [])

    @property
    def chat_tools(self) -> list[dict[str, Any]] | None:
        return [t.for_chat() for t in self.tools] or None

    @property
    def chat_tool_choice(self) -> str | dict[str, Any]:
        """tool_choice in chat's shape, as tool_calls takes it."""
        return self._chat_tool_choice

    def _tool_choice_for_chat(self) -> str | dict[str, Any]:
        """A ValueError naming tool_choice for what loom cannot do."""
        choice = self.tool_choice
        if isinstance(choice, str):
            if choice not in ("none", "auto", "required"):
                raise ValueError(f"tool_choice: must be \"none\", \"auto\", \"required\" or "
                                 f"{{\"type\": \"function\", \"name\": ...}}, got {choice!r}")
            if choice == "required" and not self.tools:
                raise ValueError("tool_choice: \"required\" needs tools")
            return choice
        if choice.get("type") != "function":
            raise ValueError(f"tool_choice.type: {choice.get('type')!r} is not supported by "
                             "loom (only {\"type\": \"function\", \"name\": ...})")
        name = choice.get("name")
        if name not in {t.name for t in self.tools}:
            raise ValueError(f"tool_choice.name: {name!r} is not among the tools")
        return {"type": "function", "function": {"name": name}}

    def template_variables(self) -> dict[str, Any]:
        """The chat template's variables beyond the messages."""
        extra = {}
        if self.reasoning is not None and self.reasoning.effort is not None:
            extra["reasoning_effort"] = self.reasoning.effort
        return {**(self.chat_template_kwargs or {}), **extra, "tools": self.chat_tools}

    def _guided_candidates(self) -> list[tuple[str, str, Any]]:
        fmt = self.text.format if self.text is not None else None
        kind = fmt.type if fmt is not None else "text"
        return [("text.format", "json_object", True if kind == "json_object" else None),
                ("text.format", "json", fmt.json_schema if kind == "json_schema" else None),
                *super()._guided_candidates()]

    def guided_decoding(self) -> GuidedDecodingParams | None:
        """text.format or vLLM's structured output; a required or named tool call is one."""
        return with_tool_constraint(super().guided_decoding(), self.chat_tools,
                                    self.chat_tool_choice, self.parallel_tool_calls,
                                    "text.format")

    def to_sampling_params(self, max_tokens: int,
                           defaults: dict[str, Any] | None = None) -> SamplingParams:
        logprobs = (self.top_logprobs or 0) if self.wants_logprobs else None
        return self._sampling(max_tokens, logprobs, None, defaults or {})


def _check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's limits: 16 pairs, keys up to 64 characters, values up to 512."""
    if not metadata:
        return
    if len(metadata) > 16:
        raise ValueError("metadata: at most 16 key-value pairs")
    for key, value in metadata.items():
        if len(key) > 64 or len(value) > 512:
            raise ValueError(f"metadata.{key[:64]}: keys take up to 64 characters, values "
                             "up to 512")
