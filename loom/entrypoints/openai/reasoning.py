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
    """A stream split as `ReasoningParser.split` splits the whole, read as it grows: each
    piece is looked at once (the search for `</think>` goes on from where it stopped), not
    the whole text again."""
    parser: ReasoningParser
    text: str = ""
    sent_reasoning: int = 0
    """How much of the thinking went out."""
    sent_content: int = 0
    """How much of the answer went out."""
    think_from: int | None = None
    """Where the thinking starts in text (None: not known yet, or no thinking)."""
    all_answer: bool = False
    """The output turned out not to open with thinking: all of it is the answer."""
    searched: int = 0
    """No </think> starts before this."""
    think_end: int | None = None
    """Where </think> starts, once written."""
    answer_from: int = 0
    """Where the answer starts, past </think> and the whitespace after it."""

    def feed(self, piece: str) -> tuple[str, str]:
        """(reasoning, content) that may go out now."""
        self.text += piece
        if not self._decided():
            return "", ""  # may still open with <think>
        if self.all_answer:
            return "", self._content(0)
        text = self.text
        if self.think_end is None:
            end = text.find(END, self.searched)
            if end < 0:  # still thinking: hold back what may be the start of </think>
                self.searched = max(self.think_from, len(text) - len(END) + 1)
                return self._reasoning(max(self.think_from,
                                           len(text) - tail_overlap(text, END))), ""
            self.think_end, self.answer_from = end, end + len(END)
        reasoning = self._reasoning(self.think_end)
        while self.answer_from < len(text) and text[self.answer_from].isspace():
            self.answer_from += 1
        return reasoning, self._content(self.answer_from)

    def end(self) -> tuple[str, str]:
        """What is left once the output is complete."""
        reasoning, content = self.parser.split(self.text)
        r, c = reasoning or "", content or ""
        return r[self.sent_reasoning:], c[self.sent_content:]

    def _decided(self) -> bool:
        if self.think_from is not None or self.all_answer:
            return True
        body = self.text.lstrip()
        if START.startswith(body):
            return False
        if body.startswith(START):
            self.think_from = len(self.text) - len(body) + len(START)
        elif self.parser.opened_by_template:
            self.think_from = 0
        else:
            self.all_answer = True
        self.searched = self.think_from or 0
        return True

    def _reasoning(self, end: int) -> str:
        """The thinking up to text[end] not sent yet."""
        start = self.think_from + self.sent_reasoning
        if end <= start:
            return ""
        self.sent_reasoning = end - self.think_from
        return self.text[start:end]

    def _content(self, start: int) -> str:
        """The answer (from text[start]) not sent yet."""
        begin = start + self.sent_content
        if begin >= len(self.text):
            return ""
        self.sent_content = len(self.text) - start
        return self.text[begin:]
