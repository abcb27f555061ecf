"""A chat request's tools and tool_choice, and the tool calls read out of its output:

- `"none"`: the tools only reach the chat template;
- `"auto"` (the default when tools are given): the model may call tools in its own syntax,
  read back by the server's `--tool-call-parser` (`tool_parsers`);
- `"required"` and a named function: the output is constrained by a JSON schema (an array
  of `{"name", "parameters"}` objects, or the named function's parameters), so it always
  parses.

Streamed, a named call's arguments go out as they are generated; "auto" sends content until
the text may begin a call, then each call as the parser reads it (its name once whole, its
arguments as they are written, or for pythonic as each call closes); "required" sends its
calls at the end.
"""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from loom.entrypoints.openai.tool_parsers import (TOOL_PARSERS, CallReading, FunctionCall,
                                                  ToolParser)
from loom.sampling_params import GuidedDecodingParams

_NO_PARAMETERS = {"type": "object", "properties": {}}
"""OpenAI: a function without `parameters` takes none."""


def check_tools(tools: list[Any] | None, tool_choice: Any) -> None:
    """A ValueError naming the field for tools or a tool_choice OpenAI would refuse."""
    for i, tool in enumerate(tools or []):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            raise ValueError(f"{where}.type: must be \"function\"")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"{where}.function.name: must be a non-empty string")
        if fn.get("parameters") is not None and not isinstance(fn["parameters"], dict):
            raise ValueError(f"{where}.function.parameters: must be a JSON schema object")
    if tool_choice is None or tool_choice == "none":
        return
    if not tools:
        raise ValueError("tool_choice: needs tools")
    if isinstance(tool_choice, str):
        if tool_choice not in ("auto", "required"):
            raise ValueError(f"tool_choice: must be \"none\", \"auto\", \"required\" or "
                             f"{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got "
                             f"{tool_choice!r}")
        return
    name = named_function(tool_choice)
    if name not in {t["function"]["name"] for t in tools}:
        raise ValueError(f"tool_choice.function.name: {name!r} is not among the tools")


def named_function(tool_choice: Any) -> str:
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    if (tool_choice.get("type") != "function" or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)):
        raise ValueError("tool_choice: a named tool choice is {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}}")
    return fn["name"]


def tool_mode(tools: list[dict] | None, tool_choice: Any) -> str:
    """none, auto, required or named (after check_tools)."""
    if not tools or tool_choice == "none":
        return "none"
    if tool_choice is None:
        return "auto"  # OpenAI's default when tools are given
    return tool_choice if isinstance(tool_choice, str) else "named"


def tool_schema(tools: list[dict], tool_choice: Any, parallel: bool | None) -> dict | None:
    """The JSON schema a required or named tool choice constrains the output to."""
    mode = tool_mode(tools, tool_choice)
    by_name = {t["function"]["name"]: t["function"].get("parameters") or _NO_PARAMETERS
               for t in tools or []}
    if mode == "named":
        return by_name[named_function(tool_choice)]
    if mode != "required":
        return None
    # Each tool's parameters sit inside the array's items, where their references to the
    # schema root ("#/$defs/...") would miss: their definitions move to the root.
    roots: dict[str, dict] = {}
    options = []
    for name, params in by_name.items():
        params = copy.deepcopy(params)
        for key in ("$defs", "definitions"):
            for def_name, schema in params.pop(key, {}).items():
                if roots.setdefault(key, {}).setdefault(def_name, schema) != schema:
                    raise ValueError(f"tools: two tools define {key}/{def_name} differently")
        options.append({"type": "object", "required": ["name", "parameters"],
                        "properties": {"name": {"enum": [name]}, "parameters": params}})
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": options}, **roots}
    if parallel is False:
        schema["maxItems"] = 1
    return schema


def with_tool_constraint(constraint: GuidedDecodingParams | None, tools: list[dict],
                         tool_choice: Any, parallel: bool | None,
                         format_field: str) -> GuidedDecodingParams | None:
    """A request's structured output, or the schema a required or named tool choice
    constrains the output to; both at once is a ValueError (format_field: what the request
    calls its own output format)."""
    schema = tool_schema(tools, tool_choice, parallel)
    if schema is None:
        return constraint
    if constraint is not None:
        raise ValueError("tool_choice: a required or named tool call constrains the output "
                         f"itself; it cannot be combined with {format_field} or "
                         "structured_outputs")
    return GuidedDecodingParams(json=schema)


@dataclass(frozen=True)
class ToolCall:
    """One call as sent: its id, its index within the choice, and the function."""
    id: str
    index: int
    function: FunctionCall


def _new_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def _numbered(calls: list[FunctionCall]) -> list[ToolCall]:
    return [ToolCall(_new_id(), i, c) for i, c in enumerate(calls)]


def _required_calls(text: str) -> list[FunctionCall]:
    try:
        items = json.loads(text)
    except ValueError:
        return []
    if not isinstance(items, list):
        return []
    calls = [FunctionCall(i["name"], json.dumps(i["parameters"], ensure_ascii=False))
             for i in items if isinstance(i, dict) and isinstance(i.get("name"), str)
             and "parameters" in i]
    return calls if len(calls) == len(items) else []


@dataclass
class ToolCalls:
    """How one chat request's output becomes content and tool calls."""
    mode: str
    parser: ToolParser | None = None
    name: str | None = None
    """The named function's name."""
    parallel: bool = True

    @classmethod
    def for_request(cls, tools: list[dict] | None, tool_choice: Any, parallel: bool | None,
                    parser_name: str | None) -> ToolCalls:
        """parser_name: the server's --tool-call-parser; "auto" needs one."""
        mode = tool_mode(tools, tool_choice)
        if mode == "auto" and parser_name is None:
            raise ValueError("tool_choice: \"auto\" (the default with tools) needs the server "
                             "started with --enable-auto-tool-choice and --tool-call-parser; "
                             "or send tool_choice \"none\", \"required\" or a named function")
        return cls(mode, TOOL_PARSERS[parser_name]() if mode == "auto" else None,
                   named_function(tool_choice) if mode == "named" else None, parallel is not False)

    @property
    def keeps_special_tokens(self) -> bool:
        return self.parser is not None and self.parser.keeps_special_tokens

    def whole(self, text: str, finish_reason: str | None
              ) -> tuple[str | None, list[ToolCall], str | None]:
        """(content, calls, finish_reason) of a finished choice."""
        if self.mode == "none":
            return text, [], finish_reason
        if self.mode == "named":
            return None, _numbered([FunctionCall(self.name, text)]), finish_reason
        if self.mode == "required":
            content, calls = None, _required_calls(text)
        else:
            content, calls = self.parser.extract(text)
        if not calls:
            return text, [], finish_reason
        if not self.parallel:
            calls = calls[:1]
        # As OpenAI: a model that stopped to call tools finishes with "tool_calls" (a forced
        # named call stays "stop").
        return content, _numbered(calls), "tool_calls" if finish_reason == "stop" else finish_reason

    def stream(self) -> ToolStream:
        return ToolStream(self)


@dataclass
class ToolStream:
    """One choice's stream: what of each new piece of text may go out, and at the end the
    rest of the content and the calls. Each call opens once the parser has its name whole
    (`partial_calls`) and its arguments follow as the parser reads them; what the parser
    could not read before the end (a hermes call whose arguments are a JSON string, the calls
    after one it could not read alone) goes out at the end, from the whole output's reading."""
    calls: ToolCalls
    text: str = ""
    sent: int = 0
    """How much of text went out as content."""
    named_id: str | None = None
    opened: list[str] = field(default_factory=list)
    """The ids of the calls sent so far, by index."""
    args_sent: list[str] = field(default_factory=list)
    """The arguments text sent so far of each opened call."""
    reading: CallReading = field(default_factory=CallReading)
    """The parser's reading of the calls so far (`partial_calls`)."""
    done: int = 0
    """How many calls are settled and sent whole: not looked at again."""

    def feed(self, piece: str) -> tuple[str, list[ToolCall | tuple[int, str]]]:
        """(content to send, tool-call deltas to send): a ToolCall opens a call, (index,
        arguments) continues one."""
        mode = self.calls.mode
        if mode == "none":  # the common stream: nothing kept, nothing held back
            return piece, []
        self.text += piece
        if mode == "named":
            if self.named_id is None:
                self.named_id = f"chatcmpl-tool-{uuid.uuid4().hex}"
                return "", [ToolCall(self.named_id, 0, FunctionCall(self.calls.name, piece))]
            return "", [(0, piece)] if piece else []
        safe = 0 if mode == "required" else self.calls.parser.content_prefix(self.text)
        out = self.text[self.sent:safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        return out, self._call_deltas() if mode == "auto" else []

    def _call_deltas(self) -> list[ToolCall | tuple[int, str]]:
        out: list[ToolCall | tuple[int, str]] = []
        calls = self.calls.parser.partial_calls(self.text, self.reading)
        for i in range(self.done, len(calls)):
            name, args = calls[i]
            if i == len(self.opened):
                if name is None or (i and not self.calls.parallel):
                    break
                self.opened.append(_new_id())
                self.args_sent.append(args)
                out.append(ToolCall(self.opened[i], i, FunctionCall(name, args)))
            elif len(args) > len(self.args_sent[i]):
                out.append((i, args[len(self.args_sent[i]):]))
                self.args_sent[i] = args
        self.done = min(len(self.reading.settled), len(self.opened))
        return out

    def end(self, finish_reason: str | None
            ) -> tuple[str, list[ToolCall | tuple[int, str]], str | None]:
        """What is left to send once the choice has finished, and its finish reason."""
        if self.calls.mode in ("none", "named"):
            return "", [], finish_reason
        content, calls, finish_reason = self.calls.whole(self.text, finish_reason)
        if not calls:
            # Not calls after all (the output broke off in one, or was not well-formed): the
            # rest is content, as a whole response would have it; calls already opened stay
            # as far as they were read.
            return self.text[self.sent:], [], finish_reason
        # What went out is the start of the content (a parser's content_prefix never passes
        # the first call).
        return (content or "")[self.sent:], self._rest_of(calls), finish_reason

    def _rest_of(self, calls: list[ToolCall]) -> list[ToolCall | tuple[int, str]]:
        """What is left to send of the finished output's calls."""
        out: list[ToolCall | tuple[int, str]] = []
        for call in calls:
            if call.index >= len(self.opened):
                out.append(call)
                continue
            sent, args = self.args_sent[call.index], call.function.arguments
            if args.startswith(sent) and len(args) > len(sent):
                out.append((call.index, args[len(sent):]))
        return out
