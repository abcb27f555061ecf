"""The models' own tool-call syntax, read back out of generated text (`--tool-call-parser`):

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks anywhere in the
  text (Hermes 2 Pro and later, Qwen2.5, Qwen3); the text outside them is the content.
- `llama3_json`: the whole output is one or more `{"name": ..., "parameters": {...}}`
  objects, separated by `;`, after an optional `<|python_tag|>` (Llama 3.1 / 3.2 JSON tool
  calling); nothing else is content.
- `pythonic`: the whole output is a Python list of calls, `[get_weather(city="Paris"),
  now()]`, with literal keyword arguments (Llama 3.2 and Llama 4 pythonic tool calling,
  optionally inside `<|python_start|>...<|python_end|>`); nothing else is content.

A parser answers three questions: which calls a finished text holds (`extract`); how much
of a text still being generated is content whatever follows (`content_prefix`), which is
what a stream may send before the calls are known; and, for streams, each call's name and
the arguments written so far (`partial_calls`), so that a call goes out as the model writes
it. Text that is not a well-formed call is content, whole: nothing the model wrote is
dropped. A JSON call's arguments are the model's own JSON text, whole or streamed; a
pythonic call's are its keyword arguments as JSON, streamed once its closing parenthesis
is written (before that, Python literals do not say what their JSON will be).

A call a stream opened (its name was whole) can still prove not to be one: the output goes
on with something its syntax does not allow, or breaks off. A finished text's reading is
then no calls and all of it content, and a stream ends the same way: the rest of the text
goes out as content, and the calls it opened stay as far as they were sent.
"""

from __future__ import annotations

import ast
import json
import keyword
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Protocol

from loom.entrypoints.openai.partial_json import (GrowingScan, Members, ObjectReading,
                                                  object_members, read_object, skip_space,
                                                  string_value)
from loom.entrypoints.openai.partial_python import Brackets


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


_SPACE = re.compile(r"\s*")
"""What str.strip() takes off (Unicode whitespace), as a finished output's reading does."""


def _after_space(text: str, i: int) -> int:
    return _SPACE.match(text, i).end()


def _whole_output_call_prefix(text: str, opener: str, tag: str) -> int:
    """content_prefix of a syntax where calls are the whole output: nothing may go out while
    the output may still open with them (opener, or tag), all of it once it cannot."""
    head = _after_space(text, 0)
    if (head == len(text) or text.startswith(opener, head) or text.startswith(tag, head)
            or (len(text) - head < len(tag) and tag.startswith(text[head:]))):
        return 0
    return len(text)


def _after_tag(text: str, tag: str) -> int:
    """Where a whole-output syntax's calls begin: after space, the optional tag and space."""
    i = _after_space(text, 0)
    return _after_space(text, i + len(tag)) if text.startswith(tag, i) else i


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
    """One stream's reading of its calls, kept between pieces (`partial_calls`), so that
    each piece is read once and a closed call is never read again."""
    settled: list[PartialCall] = field(default_factory=list)
    """The calls read to their end, in order; their text is behind `resume`."""
    resume: int = 0
    """Where the text after the last settled call begins."""
    stopped: bool = False
    """The text proved to hold no more calls (one that is not a call, or what may not
    follow one): nothing after the settled calls will be read."""
    open: GrowingScan = field(default_factory=GrowingScan)
    """The scan of the text still being written, resumed at each piece."""

    def settle(self, call: PartialCall | None, end: int) -> None:
        """A call read to its end (None: its text proved not a call)."""
        if call is None:
            self.stopped = True
        else:
            self.settled.append(call)
            self.resume = end

    def calls(self, open_call: PartialCall | None = None) -> list[PartialCall]:
        return [*self.settled, open_call] if open_call else list(self.settled)


class ToolParser(Protocol):
    keeps_special_tokens: bool

    def extract(self, text: str) -> tuple[str | None, list[FunctionCall]]: ...

    def content_prefix(self, text: str) -> int: ...

    def partial_calls(self, text: str, reading: CallReading | None = None
                      ) -> list[PartialCall]: ...


def _call_parts(text: str, members: Members, argument_keys: tuple[str, ...]) -> PartialCall:
    """(name, the arguments object's text so far) of a call object's members read so far;
    the arguments "" unless they are an object."""
    name = None
    start, end = members.get("name", (0, None))
    if end is not None and text[start] == '"':
        name = string_value(text, start, end)
    key = next((k for k in argument_keys if k in members), None)
    if key is None or text[members[key][0]] != "{":
        return name, ""
    start, end = members[key]
    return name, text[start:end]


def _call_text(text: str, i: int, argument_keys: tuple[str, ...],
               scan: GrowingScan | None = None) -> PartialCall | None:
    """_call_parts of the call JSON at text[i:] (after any space); None if it is not (the
    start of) an object."""
    head = skip_space(text, i)
    members = object_members(text, head, scan) if head < len(text) else {}
    return None if members is None else _call_parts(text, members, argument_keys)


def _closed_call(text: str, start: int, reading: ObjectReading,
                 argument_keys: tuple[str, ...]) -> FunctionCall | None:
    """The call a closed object at text[start] holds, if json reads it as one; its
    arguments the model's own JSON text, as a stream sends them."""
    try:
        call = call_from_json(json.loads(text[start:reading.end]), argument_keys)
    except ValueError:
        return None
    raw = call and _call_parts(text, reading.members, argument_keys)[1]
    return FunctionCall(call.name, raw) if raw else call


class HermesParser:
    START, END = "<tool_call>", "</tool_call>"
    keeps_special_tokens = True
    """Some tokenizers mark <tool_call> special; skipping special tokens would hide it."""
    ARGUMENTS = ("arguments", "parameters")

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
            raw = _call_text(body, 0, self.ARGUMENTS)[1]  # the model's JSON text, as streamed
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
        while not reading.stopped and (start := text.find(self.START, reading.resume)) >= 0:
            end = text.find(self.END, start)
            if end < 0:
                return reading.calls(_call_text(text, start + len(self.START),
                                                self.ARGUMENTS, reading.open))
            reading.settle(_call_text(text[:end], start + len(self.START), self.ARGUMENTS),
                           end + len(self.END))
        return reading.calls()


class Llama3JsonParser:
    TAG = "<|python_tag|>"
    keeps_special_tokens = False
    ARGUMENTS = ("parameters", "arguments")

    def extract(self, text: str) -> tuple[str | None, list[FunctionCall]]:
        calls, pos, scan = [], self._first_object(text), GrowingScan()
        if pos < 0:
            return text, []
        while pos < len(text):
            reading = read_object(text, pos, scan)
            call = (_closed_call(text, pos, reading, self.ARGUMENTS)
                    if reading is not None and reading.end is not None else None)
            if call is None:
                return text, []
            calls.append(call)
            pos = _next_object(text, reading.end)
            if pos < 0:
                return text, []
        return None, calls

    def content_prefix(self, text: str) -> int:
        return _whole_output_call_prefix(text, "{", self.TAG)

    def partial_calls(self, text: str, reading: CallReading | None = None
                      ) -> list[PartialCall]:
        """As HermesParser's: each object's name once whole and its arguments object's
        text so far; a closed object is read as json reads it, once."""
        reading = reading or CallReading()
        while not reading.stopped:
            pos = (_next_object(text, reading.resume) if reading.settled
                   else self._first_object(text))
            if pos < 0 and reading.settled:
                reading.stopped = True  # what follows a call is neither ';' nor the end
            read = read_object(text, pos, reading.open) if 0 <= pos < len(text) else None
            if read is None:
                break
            if read.end is None:
                return reading.calls(_call_parts(text, read.members, self.ARGUMENTS))
            call = _closed_call(text, pos, read, self.ARGUMENTS)
            reading.settle(call and (call.name, call.arguments), read.end)
        return reading.calls()

    def _first_object(self, text: str) -> int:
        """Where the first call object opens; -1 if the output does not open with one."""
        i = _after_tag(text, self.TAG)
        return i if text.startswith("{", i) else -1


def _next_object(text: str, end: int) -> int:
    """After a call object ending at end: where the next opens (after a ';'), len(text)
    if the text ends first, -1 if something else follows."""
    i = _after_space(text, end)
    if i == len(text):
        return i
    if text[i] != ";":
        return -1
    i = _after_space(text, i + 1)
    return i if i == len(text) or text[i] == "{" else -1


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


_NOT_PYTHONIC = (SyntaxError, ValueError, TypeError, RecursionError)
"""What reading a pythonic call's text can raise when it is not one."""


def _call_of(node: ast.expr) -> FunctionCall | None:
    """A call of a function by name with keyword arguments only, its arguments as JSON;
    None if node is not one. Raises _NOT_PYTHONIC for arguments that are not literals."""
    if (not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name)
            or node.args or any(k.arg is None for k in node.keywords)):
        return None
    args = {k.arg: _literal(k.value) for k in node.keywords}
    return FunctionCall(node.func.id, json.dumps(args, ensure_ascii=False))


def _pythonic_call(source: str) -> FunctionCall | None:
    try:
        return _call_of(ast.parse(source, mode="eval").body)
    except _NOT_PYTHONIC:
        return None


_CALL_OPENS = re.compile(r"\s*+((?!\d)\w++)\s*+\(")
_COMMA = re.compile(r"\s*+,")


def _function_name(written: str) -> str | None:
    """The name Python reads (NFKC-normalized) for an identifier as written; None if it is
    not one."""
    if not written.isidentifier() or keyword.iskeyword(written):
        return None
    return written if written.isascii() else unicodedata.normalize("NFKC", written)


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
            calls = [_call_of(node) for node in tree.elts]
        except _NOT_PYTHONIC:
            return text, []
        return (text, []) if None in calls else (None, calls)

    def content_prefix(self, text: str) -> int:
        return _whole_output_call_prefix(text, "[", self.START)

    def partial_calls(self, text: str, reading: CallReading | None = None
                      ) -> list[PartialCall]:
        """Each call's name once its '(' is written; its arguments, as JSON, once its ')'
        is (each call's text is parsed once, alone)."""
        reading = reading or CallReading()
        while not reading.stopped:
            if reading.settled:
                comma = _COMMA.match(text, reading.resume)
                pos = comma.end() if comma else -1
            else:
                pos = self._first_call(text)
            opens = _CALL_OPENS.match(text, pos) if pos >= 0 else None
            name = opens and _function_name(opens.group(1))
            if not name:  # not yet, or not a call (which the whole output's reading says)
                break
            end = reading.open.end_of(text, opens.end() - 1, Brackets)
            if end is None:
                return reading.calls((name, ""))
            call = _pythonic_call(text[opens.start(1):end])
            reading.settle(call and (call.name, call.arguments), end)
        return reading.calls()

    def _first_call(self, text: str) -> int:
        """Where the list's first call begins (after its '['); -1 if the output does not
        open with a list."""
        i = _after_tag(text, self.START)
        return i + 1 if text.startswith("[", i) else -1


TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser, "llama3_json": Llama3JsonParser, "pythonic": PythonicParser}
"""--tool-call-parser's names; a --tool-parser-plugin file adds its own."""


def register_tool_parser(name: str):
    """Class decorator for a --tool-parser-plugin file: `@register_tool_parser("mine")` makes
    the class (ToolParser's methods: extract, content_prefix, partial_calls, and
    keeps_special_tokens) what `--tool-call-parser mine` reads calls with."""
    def register(cls):
        TOOL_PARSERS[name] = cls
        return cls
    return register

