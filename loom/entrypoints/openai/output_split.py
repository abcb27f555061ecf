"""A generated text's parts, whole or streamed, for chat and the Responses API alike: the
server's --reasoning-parser splits off the thinking, then the request's `ToolCalls` reads
the calls out of the answer; what is left is the content."""

from __future__ import annotations

from dataclasses import dataclass

from loom.entrypoints.openai.reasoning import END, START, ReasoningParser, ReasoningStream
from loom.entrypoints.openai.tool_calls import ToolCall, ToolCalls, ToolStream

CallDelta = ToolCall | tuple[int, str]
"""A call opening (its id, name and arguments so far) or more of call index's arguments."""


@dataclass(frozen=True)
class OutputSplit:
    tools: ToolCalls
    reasoning: ReasoningParser | None

    def whole(self, text: str, finish_reason: str | None
              ) -> tuple[str | None, str | None, list[ToolCall], str | None]:
        """A finished output's (reasoning, content, tool calls, finish reason: "tool_calls"
        where the model stopped to call tools)."""
        thinking, answer = self.reasoning.split(text) if self.reasoning else (None, text)
        content, calls, finish_reason = self.tools.whole(answer or "", finish_reason)
        return thinking, (None if answer is None and not calls else content), calls, finish_reason

    def reasoning_end(self, text: str) -> int:
        """Where the thinking ends in the raw output (after `</think>`); 0: no thinking."""
        if self.reasoning is None:
            return 0
        if not (text.lstrip().startswith(START) or self.reasoning.opened_by_template):
            return 0
        end = text.find(END)
        return len(text) if end < 0 else end + len(END)

    def stream(self) -> SplitStream:
        return SplitStream(self.tools.stream(),
                           ReasoningStream(self.reasoning) if self.reasoning else None)


@dataclass
class SplitStream:
    """One streamed output on its way out: thinking split off, then tool calls."""
    tools: ToolStream
    reasoning: ReasoningStream | None

    def feed(self, text: str, finish_reason: str | None
             ) -> tuple[str, str, list[CallDelta], str | None]:
        """(reasoning, content, call deltas, finish reason) that may go out for a new piece
        of text; finish_reason not None: the output ends with it (the rest goes out)."""
        thinking, answer = self.reasoning.feed(text) if self.reasoning else ("", text)
        content, calls = self.tools.feed(answer)
        if finish_reason is None:
            return thinking, content, calls, None
        if self.reasoning is not None:
            more_thinking, more_answer = self.reasoning.end()
            more_content, more_calls = self.tools.feed(more_answer)
            thinking, content = thinking + more_thinking, content + more_content
            calls = calls + more_calls
        rest, more_calls, finish_reason = self.tools.end(finish_reason)
        return thinking, content + rest, calls + more_calls, finish_reason
