"""POST /v1/chat/completions and /tokenize, /detokenize request and response bodies (pydantic):
the chat messages (which /tokenize renders too) and their streamed and whole responses."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from loom.config_checks import check_bools
from loom.entrypoints.openai.protocol import (MAX_LOGPROBS, OpenAIModel, PromptLogprobs,
                                              RequestBody, SamplingFields, TokenId, UsageInfo,
                                              refuse_extensions)
from loom.entrypoints.openai.tool_calls import ToolCall, check_tools, with_tool_constraint
from loom.frontend.chat_content import resolve_content_format, template_content
from loom.sampling_params import GuidedDecodingParams, SamplingParams


class ContentPart(OpenAIModel):
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # other fields reach the template as given
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict[str, Any]] | None = None

    def texts(self) -> list[str]:
        """The content's text: none, the string, or each text part's (a part without text
        is skipped, as vLLM skips it)."""
        if self.content is None or isinstance(self.content, str):
            return [] if self.content is None else [self.content]
        kinds = {p.type for p in self.content} - {"text"}
        if kinds:
            raise ValueError(f"messages: content parts of type {sorted(kinds)} are not supported")
        return [p.text for p in self.content if p.text is not None]

    def for_template(self, content_format: str = "string") -> dict[str, Any]:
        """The message as the chat template reads it; content_format "string" or "openai"
        (`loom.frontend.chat_content`). An assistant turn that only calls tools has content
        null: the key is there all the same (empty), as vLLM renders it."""
        message = self.model_dump(exclude_none=True)
        if "reasoning" in message:  # an earlier turn's thinking, under the templates' name
            message.setdefault("reasoning_content", message["reasoning"])
        # Tool results stay strings in either format, as vLLM hands them over.
        message["content"] = template_content(
            self.texts(), "string" if self.role == "tool" else content_format)
        return message


RESERVED_TEMPLATE_VARIABLES = ("messages", "add_generation_prompt", "tools", "chat_template")
"""What a request's own fields set, never chat_template_kwargs (chat_template is the
renderer's argument, not a variable)."""


def check_chat_options(add_generation_prompt: bool, continue_final_message: bool,
                       chat_template_kwargs: dict[str, Any] | None) -> None:
    check_bools({"add_generation_prompt": add_generation_prompt,
                 "continue_final_message": continue_final_message})
    if chat_template_kwargs is not None and not (
            isinstance(chat_template_kwargs, dict)
            and all(isinstance(k, str) for k in chat_template_kwargs)):
        raise ValueError(f"chat_template_kwargs: must be a dict of variable names to values, "
                         f"got {chat_template_kwargs!r}"[:200])
    reserved = set(RESERVED_TEMPLATE_VARIABLES) & set(chat_template_kwargs or {})
    if reserved:
        raise ValueError(f"chat_template_kwargs: {sorted(reserved)} are set by the request "
                         "itself")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message: set add_generation_prompt to false with it")


def render_chat(tokenizer, messages: list[ChatMessage], add_generation_prompt: bool = True,
                continue_final_message: bool = False, chat_template: str | None = None,
                template_variables: dict[str, Any] | None = None,
                content_format: str = "auto") -> str:
    """The conversation as the chat template renders it, for the server and `LLM.chat`
    alike; template_variables: more variables for the template (tools, chat_template_kwargs);
    content_format: vLLM's --chat-template-content-format. A ValueError when there is no
    template or it refuses the messages."""
    content_format = resolve_content_format(content_format,
                                            chat_template or tokenizer.chat_template)
    conversation = [m.for_template(content_format) for m in messages]
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt, chat_template,
                                         **(template_variables or {}))
    if continue_final_message:
        text = cut_after_final_message(text, "\n".join(messages[-1].texts()))
    return text


def cut_after_final_message(text: str, final_content: str) -> str:
    """Drop what the template wrote after the last message (its end-of-turn), so that the
    model continues that message. Templates may trim the content (Llama 3's does): it is
    found without its outer whitespace, and its trailing whitespace is kept only where
    the template kept it (as transformers does)."""
    core = final_content.strip()
    if not core or core not in text:
        raise ValueError("continue_final_message: the final message's content is not in the "
                         "rendered prompt")
    start = text.rindex(core)
    kept = final_content.lstrip()
    end = start + (len(kept) if text[start:start + len(kept)] == kept else len(core))
    return text[:end]


class ChatTemplateFields(OpenAIModel):
    """How a request's messages are rendered: chat completions' and /tokenize's."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's: more variables for the chat template (Qwen3's enable_thinking, ...)."""
    documents: list[dict[str, Any]] | None = None
    """vLLM's: the template's `documents` (RAG templates)."""
    chat_template: str | None = None
    """vLLM's: the request's own template, if the server runs with
    --trust-request-chat-template (a template is code)."""

    @property
    def template_variables(self) -> dict[str, Any]:
        """The template's variables beyond the messages."""
        extra = {"documents": self.documents} if self.documents is not None else {}
        return {**(self.chat_template_kwargs or {}), "tools": self.tools or None, **extra}

    def check_template_fields(self, tool_choice: Any = "none") -> None:
        check_tools(self.tools, tool_choice)
        check_chat_options(self.add_generation_prompt, self.continue_final_message,
                           self.chat_template_kwargs)


class ChatCompletionRequest(SamplingFields, ChatTemplateFields):
    messages: list[ChatMessage] = Field(min_length=1)
    request_id: str | None = Field(None, min_length=1, max_length=256)
    """vLLM's: the id's base (`cmpl-<it>`, `chatcmpl-<it>`); an X-Request-Id header wins."""
    echo: bool = False
    """vLLM's: the reply's content starts with the last message's where their roles agree
    (a continued final message, say)."""
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    include_reasoning: bool = True
    """vLLM's: with a --reasoning-parser, send the thinking in `reasoning` (else drop it)."""
    return_token_ids: StrictBool | None = None
    """vLLM's: the rendered prompt's token ids, and each choice's raw generated ones."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_chat_extensions(cls, data: Any) -> Any:
        refuse_extensions(data, ("mm_processor_kwargs",))
        return data

    @model_validator(mode="after")
    def _check_chat(self):
        self.check_template_fields(self.tool_choice)
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs to be true")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def guided_decoding(self) -> GuidedDecodingParams | None:
        """The request's structured output; a required or named tool call is one too."""
        return with_tool_constraint(super().guided_decoding(), self.tools, self.tool_choice,
                                    self.parallel_tool_calls, "response_format")

    def to_sampling_params(self, max_tokens: int,
                           defaults: dict[str, Any] | None = None) -> SamplingParams:
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self._sampling(max_tokens, logprobs, self.prompt_logprobs, defaults or {})


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class FunctionCallOut(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut

    @classmethod
    def of(cls, call: ToolCall) -> ToolCallOut:
        return cls(id=call.id, function=FunctionCallOut(name=call.function.name,
                                                        arguments=call.function.arguments))


class ChatMessageOut(BaseModel):
    role: str = "assistant"
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    """return_token_ids: every generated id, before thinking and tool calls are read out."""


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: PromptLogprobs | None = None
    prompt_token_ids: list[int] | None = None
    """return_token_ids: the rendered prompt's ids, as the engine ran them."""


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallOut

    @classmethod
    def of(cls, delta: ToolCall | tuple[int, str]) -> DeltaToolCall:
        """A call's opening (its id, name and the arguments so far) or more of its arguments."""
        if isinstance(delta, tuple):
            return cls(index=delta[0], function=FunctionCallOut(arguments=delta[1]))
        return cls(index=delta.index, id=delta.id, type="function",
                   function=FunctionCallOut(name=delta.function.name,
                                            arguments=delta.function.arguments))


class DeltaMessage(BaseModel):
    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    """return_token_ids: the generated ids this chunk adds."""


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None
    """return_token_ids: in each choice's first chunk only (its role), as vLLM sends it."""


# -- /tokenize, /detokenize -----------------------------------------------------------------

class TokenizeRequest(RequestBody, ChatTemplateFields):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    return_token_strs: bool = False
    """vLLM's: the tokens' strings too (the tokenizer's own pieces)."""

    @model_validator(mode="after")
    def _one_input(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("prompt: give exactly one of prompt and messages")
        self.check_template_fields()
        return self


class TokenizeResponse(BaseModel):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str | None] | None = None


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(BaseModel):
    prompt: str
