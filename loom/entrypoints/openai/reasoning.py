"""Reasoning models' thinking, split from their answer (`--reasoning-parser`), into the chat
message's `reasoning` field (vLLM's name since it retired `reasoning_content`):

- `qwen3`: thinking is `<think>...</think>` at the start of the output (Qwen3 thinks unless
  `chat_template_kwargs: {"enable_thinking": false}`); an output that does not open with
  `<think>` is all answer.
- `deepseek_r1`: the template opens `<think>` itself, so the output is thinking until
  `</think>` (a leading `<think>` is dropped); with no `</think>` it is all thinking.

The whitespace between `</think>` and the answer is dropped. `ReasoningStream` splits a
stream the same way, holding back only what may still turn out to be a tag.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.entrypoints.openai.tool_parsers import tail_overlap

START, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    opened_by_template: bool
    """deepseek_r1: the output is thinking from its first token."""

    def split(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole output."""
        body = text.lstrip()
        opened = body.startswith(START)
        if not (opened or self.opened_by_template):
            return None, text
        body = body[len(START):] if opened else text
        thinking, closed, answer = body.partition(END)
        answer = answer.lstrip()
        return thinking, (answer or None) if closed else None


REASONING_PARSERS = {"qwen3": ReasoningParser(opened_by_template=False),
                     "deepseek_r1": ReasoningParser(opened_by_template=True)}


@dataclass
class ReasoningStream:
    parser: ReasoningParser
    text: str = ""
    sent_reasoning: int = 0
    """How much of the thinking went out."""
    sent_content: int = 0
    """How much of the answer went out."""

    def feed(self, piece: str) -> tuple[str, str]:
        """(reasoning, content) that may go out now."""
        self.text += piece
        if START.startswith(self.text.lstrip()):
            return "", ""  # may still open with <think>
        reasoning, content = self.parser.split(self.text)
        if reasoning is not None and content is None:  # still thinking: hold a partial </think>
            reasoning = reasoning[:len(reasoning) - tail_overlap(reasoning, END)]
        return self._new(reasoning, content)

    def end(self) -> tuple[str, str]:
        """What is left once the output is complete."""
        return self._new(*self.parser.split(self.text))

    def _new(self, reasoning: str | None, content: str | None) -> tuple[str, str]:
        r, c = reasoning or "", content or ""
        out = r[self.sent_reasoning:], c[self.sent_content:]
        self.sent_reasoning, self.sent_content = max(self.sent_reasoning, len(r)), max(
            self.sent_content, len(c))
        return out
