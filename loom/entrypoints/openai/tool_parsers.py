"""The models' own tool-call syntax, read back out of generated text (`--tool-call-parser`):

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks anywhere in the
  text (Hermes 2 Pro and later, Qwen2.5, Qwen3); the text outside them is the content.
- `llama3_json`: the whole output is one or more `{"name": ..., "parameters": {...}}`
  objects, separated by `;`, after an optional `<|python_tag|>` (Llama 3.1 / 3.2 JSON tool
  calling); nothing else is content.

A parser answers two questions: which calls a finished text holds (`extract`), and how much
of a text still being generated is content whatever follows (`content_prefix`), which is what
a stream may send before the calls are known. Text that is not a well-formed call is content,
whole: nothing the model wrote is dropped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FunctionCall:
    name: str
    arguments: str
    """The arguments as JSON text, as OpenAI sends them."""


def call_from_json(obj: Any, argument_keys: tuple[str, ...]) -> FunctionCall | None:
    """A call from a decoded `{"name": ..., <argument key>: {...}}`; None if it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in argument_keys:
        if key in obj:
            args = obj[key]
            if isinstance(args, str):  # already JSON text
                return FunctionCall(obj["name"], args)
            if isinstance(args, dict):
                return FunctionCall(obj["name"], json.dumps(args, ensure_ascii=False))
            return None
    return FunctionCall(obj["name"], "{}")


def _tail_overlap(text: str, marker: str) -> int:
    """The length of the longest suffix of text that begins marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


class HermesParser:
    START, END = "<tool_call>", "</tool_call>"
    keeps_special_tokens = True
    """Some tokenizers mark <tool_call> special; skipping special tokens would hide it."""

    def extract(self, text: str) -> tuple[str | None, list[FunctionCall]]:
        content, calls, pos = [], [], 0
        while (start := text.find(self.START, pos)) >= 0:
            # Between and after the calls, only text that is not bare whitespace is content.
            if not calls or text[pos:start].strip():
                content.append(text[pos:start])
            end = text.find(self.END, start)
            body = text[start + len(self.START):end if end >= 0 else len(text)]
            try:
                call = call_from_json(json.loads(body), ("arguments", "parameters"))
            except ValueError:
                call = None
            if call is None:
                return text, []
            calls.append(call)
            pos = end + len(self.END) if end >= 0 else len(text)
        if not calls:
            return text, []
        if text[pos:].strip():
            content.append(text[pos:])
        joined = "".join(content)
        return (joined if joined.strip() else None), calls

    def content_prefix(self, text: str) -> int:
        start = text.find(self.START)
        return start if start >= 0 else len(text) - _tail_overlap(text, self.START)


class Llama3JsonParser:
    TAG = "<|python_tag|>"
    keeps_special_tokens = False

    def extract(self, text: str) -> tuple[str | None, list[FunctionCall]]:
        body = text.strip()
        if body.startswith(self.TAG):
            body = body[len(self.TAG):].lstrip()
        if not body.startswith("{"):
            return text, []
        decoder, calls, pos = json.JSONDecoder(), [], 0
        while pos < len(body):
            try:
                obj, pos = decoder.raw_decode(body, pos)
            except ValueError:
                return text, []
            call = call_from_json(obj, ("parameters", "arguments"))
            if call is None:
                return text, []
            calls.append(call)
            rest = body[pos:].lstrip()
            if rest and not rest.startswith(";"):
                return text, []
            pos = len(body) - len(rest[1:].lstrip()) if rest else len(body)
        return None, calls

    def content_prefix(self, text: str) -> int:
        head = text.lstrip()
        if not head or head.startswith("{") or head.startswith(self.TAG) or self.TAG.startswith(head):
            return 0
        return len(text)


TOOL_PARSERS = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}
