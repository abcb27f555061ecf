"""A response's output items, whole and streamed.

A response's text is split as a chat choice's (`output_split`). `output_items` turns a
finished split into items (a reasoning item, a message, then one function_call item per
call); `ResponseEvents` turns a streamed split into OpenAI's item events, one item open at
a time, and keeps the items it sent, which are the final response's output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from loom.entrypoints.openai.output_split import CallDelta
from loom.entrypoints.openai.protocol_chat import TokenLogprob
from loom.entrypoints.openai.protocol_responses_output import (
    ArgumentsDeltaEvent, ArgumentsDoneEvent, ContentPartEvent, FunctionCallItem, ItemStatus,
    OutputItem, OutputMessage, OutputItemEvent, OutputText, ReasoningDeltaEvent,
    ReasoningDoneEvent, ReasoningItem, ReasoningText, StreamEvent, TextDeltaEvent,
    TextDoneEvent, new_item_id)
from loom.entrypoints.openai.tool_calls import ToolCall

def output_items(thinking: str | None, content: str | None, calls: list[ToolCall],
                 logprobs: list[TokenLogprob], incomplete: bool) -> list[OutputItem]:
    """A finished response's items; the last is "incomplete" when the output was cut."""
    items: list[OutputItem] = []
    if thinking:
        items.append(ReasoningItem(id=new_item_id("rs"), content=[ReasoningText(text=thinking)],
                                   status="completed"))
    if content:
        items.append(OutputMessage(id=new_item_id("msg"), status="completed", content=[
            OutputText(text=content, logprobs=logprobs)]))
    items += [FunctionCallItem(id=new_item_id("fc"), call_id=c.id, name=c.function.name,
                               arguments=c.function.arguments, status="completed")
              for c in calls]
    if incomplete and items:
        items[-1].status = "incomplete"
    return items


@dataclass
class ResponseEvents:
    """A streamed response's item events and sequence numbers; `items` is its output."""
    sequence: int = 0
    items: list[OutputItem] = field(default_factory=list)
    current: OutputItem | None = None
    calls: dict[int, FunctionCallItem] = field(default_factory=dict)
    """The function_call items by their tool call's index."""

    def event(self, cls: type[StreamEvent], kind: str, **fields) -> StreamEvent:
        made = cls(type=kind, sequence_number=self.sequence, **fields)
        self.sequence += 1
        return made

    def reasoning(self, delta: str) -> list[StreamEvent]:
        events = [] if isinstance(self.current, ReasoningItem) else self._open(
            ReasoningItem(id=new_item_id("rs"), content=[ReasoningText()]))
        self.current.content[0].text += delta
        return events + [self.event(ReasoningDeltaEvent, "response.reasoning_text.delta",
                                    **self._where(), delta=delta)]

    def text(self, delta: str, logprobs: list[TokenLogprob]) -> list[StreamEvent]:
        events = [] if isinstance(self.current, OutputMessage) else self._open(
            OutputMessage(id=new_item_id("msg"), content=[OutputText()]))
        part = self.current.content[0]
        part.text += delta
        part.logprobs += logprobs
        return events + [self.event(TextDeltaEvent, "response.output_text.delta",
                                    **self._where(), delta=delta, logprobs=logprobs)]

    def call(self, delta: CallDelta) -> list[StreamEvent]:
        if isinstance(delta, tuple):
            index, more = delta
            item, events = self.calls[index], []
        else:
            index, more = delta.index, delta.function.arguments
            item = FunctionCallItem(id=new_item_id("fc"), call_id=delta.id,
                                    name=delta.function.name)
            self.calls[index] = item
            events = self._open(item)
        if not more:
            return events
        item.arguments += more
        return events + [self.event(ArgumentsDeltaEvent, "response.function_call_arguments.delta",
                                    item_id=item.id, output_index=self.items.index(item),
                                    delta=more)]

    def close(self, status: ItemStatus = "completed") -> list[StreamEvent]:
        """The open item's closing events (none if no item is open)."""
        item, self.current = self.current, None
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": self.items.index(item)}
        item.status = status
        if isinstance(item, FunctionCallItem):
            events = [self.event(ArgumentsDoneEvent, "response.function_call_arguments.done",
                                 **where, name=item.name, arguments=item.arguments)]
        elif isinstance(item, ReasoningItem):
            part = item.content[0]
            events = [self.event(ReasoningDoneEvent, "response.reasoning_text.done", **where,
                                 text=part.text),
                      self.event(ContentPartEvent, "response.content_part.done", **where,
                                 part=part.model_copy())]
        else:
            part = item.content[0]
            events = [self.event(TextDoneEvent, "response.output_text.done", **where,
                                 text=part.text, logprobs=part.logprobs),
                      self.event(ContentPartEvent, "response.content_part.done", **where,
                                 part=part.model_copy(deep=True))]
        return events + [self.event(OutputItemEvent, "response.output_item.done",
                                    output_index=where["output_index"],
                                    item=item.model_copy(deep=True))]

    def _open(self, item: OutputItem) -> list[StreamEvent]:
        """Close the open item, then announce this one (and its content part, empty)."""
        events = self.close()
        self.items.append(item)
        self.current = item
        added = item.model_copy(deep=True) if isinstance(item, FunctionCallItem) else (
            item.model_copy(update={"content": []}))
        events.append(self.event(OutputItemEvent, "response.output_item.added",
                                 output_index=len(self.items) - 1, item=added))
        if not isinstance(item, FunctionCallItem):
            events.append(self.event(ContentPartEvent, "response.content_part.added",
                                     **self._where(), part=item.content[0].model_copy(deep=True)))
        return events

    def _where(self) -> dict:
        return {"item_id": self.current.id, "output_index": len(self.items) - 1}
