"""The models' own tool-call syntax, read back out of generated text (`--tool-call-parser`):

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks anywhere in the
  text (Hermes 2 Pro and later, Qwen2.5, Qwen3); the text outside them is the content.
- `llama3_json`: the whole output is one or more `{"name": ..., "parameters": {...}}`
  objects, separated by `;`, after an optional `<|python_tag|>` (Llama 3.1 / 3.2 JSON tool
  calling); nothing else is content.
- `pythonic`: the whole output is a Python list of calls, `[get_weather(city="Paris"),
  now()]`, with literal keyword arguments (Llama 3.2 and Llama 4 pythonic tool calling,
  optionally inside `<|python_start|>...<|python_end|>`); nothing else is content.

A parser answers two questions: which calls a finished text holds (`extract`), and how much
of a text still being generated is content whatever follows (`content_prefix`), which is what
a stream may send before the calls are known. Text that is not a well-formed call is content,
whole: nothing the model wrote is dropped. `hermes` answers a third, for streams: each call's
name and the arguments written so far (`partial_calls`), so that a call goes out as the model
writes it; its arguments are then the model's own JSON text, whole or streamed.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

from loom.entrypoints.openai.partial_json import GrowingScan, object_members, skip_space


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


def _whole_output_call_prefix(text: str, opener: str, tag: str) -> int:
    """content_prefix of a syntax where calls are the whole output: nothing may go out while
    the output may still open with them (opener, or tag), all of it once it cannot."""
    head = text.lstrip()
    if not head or head.startswith(opener) or head.startswith(tag) or tag.startswith(head):
        return 0
    return len(text)


def tail_overlap(text: str, marker: str) -> int:
    """The length of the longest suffix of text that begins marker."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


PartialCall = tuple[str | None, str]
"""A call being written: its name (None until whole) and its arguments' text so far."""


@dataclass
class CallReading:
    """One stream's reading of its calls, kept between pieces (`partial_calls`)."""
    finished: dict[int, PartialCall | None] = field(default_factory=dict)
    """Blocks already closed, by where they start: read once."""
    open: GrowingScan = field(default_factory=GrowingScan)
    """The scan of the block still being written, resumed at each piece."""


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
                call = call_from_json(json.loads(body), self.ARGUMENTS)
            except ValueError:
                call = None
            if call is None:
                return text, []
            raw = self._call_text(body, 0)[1]  # the model's JSON text, as a stream sends it
            calls.append(FunctionCall(call.name, raw) if raw else call)
            pos = end + len(self.END) if end >= 0 else len(text)
        if not calls:
            return text, []
        if text[pos:].strip():
            content.append(text[pos:])
        joined = "".join(content)
        return (joined if joined.strip() else None), calls

    def content_prefix(self, text: str) -> int:
        start = text.find(self.START)
        return start if start >= 0 else len(text) - tail_overlap(text, self.START)

    def partial_calls(self, text: str, reading: CallReading | None = None
                      ) -> list[PartialCall]:
        """(name, arguments so far) of each call opened in a text still being written; the
        arguments "" unless they are an object. reading: the stream's own, given each time,
        so that each piece is read once."""
        reading = reading or CallReading()
        calls, pos = [], 0
        while (start := text.find(self.START, pos)) >= 0:
            end = text.find(self.END, start)
            if end < 0:
                call = self._call_text(text, start + len(self.START), reading.open)
            elif start in reading.finished:
                call = reading.finished[start]
            else:
                call = reading.finished[start] = self._call_text(text[:end],
                                                                 start + len(self.START))
            if call is None:
                break
            calls.append(call)
            if end < 0:
                break
            pos = end + len(self.END)
        return calls

    ARGUMENTS = ("arguments", "parameters")

    def _call_text(self, text: str, i: int, scan: GrowingScan | None = None
                   ) -> PartialCall | None:
        """(name, the arguments object's text so far) of the call JSON at text[i:] (after
        any space); None if it is not (the start of) an object."""
        head = skip_space(text, i)
        members = object_members(text, head, scan) if head < len(text) else {}
        if members is None:
            return None
        name = None
        if "name" in members and members["name"][1] is not None:
            value = json.loads(text[slice(*members["name"])])
            name = value if isinstance(value, str) else None
        key = next((k for k in self.ARGUMENTS if k in members), None)
        if key is None or text[members[key][0]] != "{":
            return name, ""
        start, end = members[key]
        return name, text[start:end]


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
        return _whole_output_call_prefix(text, "{", self.TAG)


_JSON_NAMES = {"true": True, "false": False, "null": None}


def _literal(node: ast.expr) -> Any:
    """A keyword argument's value: a Python literal (JSON's true/false/null too)."""
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


class PythonicParser:
    START, END = "<|python_start|>", "<|python_end|>"
    keeps_special_tokens = False

    def extract(self, text: str) -> tuple[str | None, list[FunctionCall]]:
        body = text.strip().removeprefix(self.START).removesuffix(self.END).strip()
        if not body.startswith("["):
            return text, []
        try:
            tree = ast.parse(body, mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                return text, []
            calls = []
            for node in tree.elts:
                if (not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name)
                        or node.args or any(k.arg is None for k in node.keywords)):
                    return text, []
                args = {k.arg: _literal(k.value) for k in node.keywords}
                calls.append(FunctionCall(node.func.id, json.dumps(args, ensure_ascii=False)))
        except (SyntaxError, ValueError, TypeError, RecursionError):
            return text, []
        return None, calls

    def content_prefix(self, text: str) -> int:
        return _whole_output_call_prefix(text, "[", self.START)


TOOL_PARSERS = {"hermes": HermesParser, "llama3_json": Llama3JsonParser,
                "pythonic": PythonicParser}
