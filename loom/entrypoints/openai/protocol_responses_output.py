"""POST /v1/responses response bodies (pydantic): the response object, its output items and
usage, and the server-sent events of a streamed response, in OpenAI's shapes (the request
is in `protocol_responses`)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from loom.entrypoints.openai.protocol_chat import TokenLogprob

ItemStatus = Literal["in_progress", "completed", "incomplete"]


def new_item_id(prefix: str) -> str:
    """An output item's id: msg_..., rs_..., fc_... (a response's own: resp_...)."""
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[TokenLogprob] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "in_progress"
    content: list[OutputText] = Field(default_factory=list)


class ReasoningItem(BaseModel):
    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: ItemStatus = "in_progress"


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str = ""
    status: ItemStatus = "in_progress"


OutputItem = Annotated[OutputMessage | ReasoningItem | FunctionCallItem, Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int

    @classmethod
    def of(cls, input_tokens: int, output_tokens: int, cached: int,
           reasoning: int) -> ResponseUsage:
        return cls(input_tokens=input_tokens, output_tokens=output_tokens,
                   total_tokens=input_tokens + output_tokens,
                   input_tokens_details=InputTokensDetails(cached_tokens=cached),
                   output_tokens_details=OutputTokensDetails(reasoning_tokens=reasoning))


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


ResponseStatus = Literal["completed", "failed", "in_progress", "cancelled", "queued",
                         "incomplete"]


class ResponseObject(BaseModel):
    """A response as OpenAI returns it: its output and usage, and the request's settings."""
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus
    background: bool = False
    error: Any = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=dict)
    service_tier: str = "auto"
    store: bool = False
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=dict)
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int | None = None
    top_p: float | None = None
    truncation: str = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None


# -- stream events --------------------------------------------------------------------------

class StreamEvent(BaseModel):
    type: str
    sequence_number: int = 0


class LifecycleEvent(StreamEvent):
    """response.created, .in_progress, .completed, .incomplete."""
    response: ResponseObject


class OutputItemEvent(StreamEvent):
    """response.output_item.added and .done."""
    output_index: int
    item: OutputItem


class ContentPartEvent(StreamEvent):
    """response.content_part.added and .done (an output_text or a reasoning_text part)."""
    item_id: str
    output_index: int
    content_index: int = 0
    part: OutputText | ReasoningText


class TextDeltaEvent(StreamEvent):
    """response.output_text.delta."""
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    logprobs: list[TokenLogprob] = Field(default_factory=list)


class TextDoneEvent(StreamEvent):
    """response.output_text.done."""
    item_id: str
    output_index: int
    content_index: int = 0
    text: str
    logprobs: list[TokenLogprob] = Field(default_factory=list)


class ReasoningDeltaEvent(StreamEvent):
    """response.reasoning_text.delta (vLLM's reasoning events, as OpenAI names them)."""
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str


class ReasoningDoneEvent(StreamEvent):
    """response.reasoning_text.done."""
    item_id: str
    output_index: int
    content_index: int = 0
    text: str


class ArgumentsDeltaEvent(StreamEvent):
    """response.function_call_arguments.delta."""
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(StreamEvent):
    """response.function_call_arguments.done."""
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(StreamEvent):
    """An error after the stream began: OpenAI's `error` event."""
    type: str = "error"
    code: str | None = None
    message: str
    param: str | None = None


def sse_event(event: StreamEvent) -> str:
    """One event as OpenAI frames it: its type on an `event:` line, then its JSON."""
    return f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"
