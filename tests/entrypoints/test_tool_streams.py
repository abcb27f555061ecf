"""llama3_json and pythonic calls streamed from random outputs, against Python's own readers.

Each output (random names; arguments with escapes, quotes, brackets, comments and nesting;
random spacing, separators and tags) is fed in pieces of random sizes. What a client puts
together from the stream must equal the whole output's reading, which must equal json's or
ast's reading of the calls written; every call opens, and its arguments arrive, before the
output ends. Cut short anywhere, a stream ends as the whole reading of the cut text has it,
having sent nothing that the full calls do not begin with."""

from __future__ import annotations

import json
import random
import unicodedata
from collections import Counter

import pytest

from loom.entrypoints.openai.output_split import OutputSplit
from loom.entrypoints.openai.responses_stream import ResponseEvents
from loom.entrypoints.openai.tool_calls import ToolCalls
from loom.entrypoints.openai.tool_parsers import FunctionCall, Llama3JsonParser, PythonicParser
from tests.entrypoints.test_tool_parsers import _assemble

_TRICKY = ['a"b', "x\\y", "{[}]", "\\", '\\"', "é ü \n\t", "}", ")", "#", "'", "''", "'''",
           '"""', '""', "\u2028", "", ";", "],[", "f(a=1)"]
_NAMES = ["get_weather", "f", "_x1", "météo_2", "ﬁnd", "now"]


def _value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(5 if depth < 3 else 3)
    if kind == 0:
        return rng.choice(_TRICKY) + rng.choice(["", str(rng.random()), rng.choice(_TRICKY)])
    if kind == 1:
        return rng.choice([rng.randrange(-1000, 1000), rng.random() * 1e6, True, False, None])
    if kind == 2:
        return "".join(rng.choice("ab\"'\\{}[]() ,:#;\n") for _ in range(rng.randrange(20)))
    if kind == 3:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}{rng.choice(_TRICKY)}": _value(rng, depth + 1) for i in range(rng.randrange(4))}


def _calls(rng: random.Random) -> list[tuple[str, dict]]:
    return [(rng.choice(_NAMES), {f"a{i}": _value(rng) for i in range(rng.randrange(4))})
            for _ in range(rng.randrange(1, 4))]


def _llama3_text(rng: random.Random, calls: list[tuple[str, dict]]) -> str:
    objects = []
    for name, args in calls:
        members = [("name", name), (rng.choice(["parameters", "arguments"]), args)]
        if rng.random() < 0.2:
            members.reverse()
        objects.append(json.dumps(dict(members), ensure_ascii=rng.random() < 0.5,
                                  indent=rng.choice([None, 1]),
                                  separators=rng.choice([None, (",", ":")])))
    return (rng.choice(["", " ", "\n", "<|python_tag|>", " <|python_tag|>\n"])
            + rng.choice([";", "; ", " ;\n"]).join(objects) + rng.choice(["", "\n", ";"]))


def _py_string(rng: random.Random, s: str) -> str:
    escaped = s.replace("\\", "\\\\")
    return rng.choice([
        repr(s),
        '"' + escaped.replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"',
        '"""' + escaped.replace('"', '\\"') + '"""',
        "'''" + escaped.replace("'", "\\'") + "'''"])


def _py(rng: random.Random, value) -> str:
    """value as Python source, in one of the spellings a model may use."""
    if isinstance(value, str):
        return _py_string(rng, value)
    if value is None or isinstance(value, bool):
        return rng.choice([repr(value), json.dumps(value)])  # None or null, True or true
    if isinstance(value, list):
        items = [_py(rng, v) for v in value]
        if rng.random() < 0.3:  # a tuple, which JSON reads as a list
            return "(" + "".join(i + ", " for i in items) + ")"
        return "[" + ", ".join(items) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(rng, k)}: {_py(rng, v)}" for k, v in value.items()) + "}"
    return repr(value)


def _pythonic_text(rng: random.Random, calls: list[tuple[str, dict]]) -> str:
    written = []
    for name, args in calls:
        sep = rng.choice([", ", ",", ",\n  ", ", # a comment's (quote]\n  "])
        written.append(name + rng.choice(["", " "]) + "("
                       + sep.join(f"{k}={_py(rng, v)}" for k, v in args.items()) + ")")
    start = rng.choice(["", " ", "<|python_start|>"])
    return (start + "[" + rng.choice(["", " "]) + rng.choice([", ", ",\n "]).join(written)
            + rng.choice(["", ",", " "]) + "]" + ("<|python_end|>" if start else ""))


PARSERS = {"llama3_json": (Llama3JsonParser, _llama3_text),
           "pythonic": (PythonicParser, _pythonic_text)}


def _streamed(parser, text: str, rng: random.Random, finish: str):
    """(content, early deltas, deltas at the end, finish reason) of text fed in random
    pieces; at each piece the stream's resumed reading equals a fresh one."""
    stream = ToolCalls("auto", parser).stream()
    content, early, cut = "", [], 0
    while cut < len(text):
        piece = text[cut:cut + rng.randrange(1, 9)]
        cut += len(piece)
        sent, deltas = stream.feed(piece)
        content += sent
        early += deltas
        assert parser.partial_calls(text[:cut], stream.reading) == parser.partial_calls(
            text[:cut])
    rest, more, reason = stream.end(finish)
    return content + rest, early, more, reason


@pytest.mark.parametrize("name", list(PARSERS))
@pytest.mark.parametrize("seed", range(30))
def test_random_calls_stream_as_the_whole_output_reads(name, seed):
    rng = random.Random(seed)
    parser_cls, render = PARSERS[name]
    calls = _calls(rng)
    text = render(rng, calls)
    content, whole = parser_cls().extract(text)
    assert content is None
    # Python reads identifiers NFKC-normalized (ﬁnd is find); JSON names are as written.
    as_read = (lambda n: n) if name == "llama3_json" else (
        lambda n: unicodedata.normalize("NFKC", n))
    assert [c.name for c in whole] == [as_read(n) for n, _ in calls]
    for call, (_, args) in zip(whole, calls):
        assert json.loads(call.arguments) == args
        if name == "llama3_json":  # the model's own text
            assert call.arguments in text
        else:
            assert call.arguments == json.dumps(args, ensure_ascii=False)
    content, early, more, reason = _streamed(parser_cls(), text, rng, "stop")
    assert (content, more, reason) == ("", [], "tool_calls")
    assembled = _assemble(early)
    assert [FunctionCall(c["name"], c["arguments"]) for c in assembled] == whole
    assert len({c["id"] for c in assembled}) == len(whole)
    # JSON arguments go out as they are written (pieces are at most 8 characters), from
    # the call's opening once its name is whole; a pythonic call's in one piece as it closes.
    pieces = Counter(d[0] for d in early if isinstance(d, tuple))
    at_open = {d.index: d.function.arguments for d in early if not isinstance(d, tuple)}
    for i, call in enumerate(whole):
        if name == "pythonic":
            assert pieces[i] <= 1
        elif len(call.arguments) - len(at_open[i]) > 16:  # written after the name
            assert pieces[i] > 1


@pytest.mark.parametrize("name", list(PARSERS))
@pytest.mark.parametrize("seed", range(30))
def test_random_calls_cut_short(name, seed):
    rng = random.Random(seed)
    parser_cls, render = PARSERS[name]
    full = parser_cls().extract(text := render(rng, _calls(rng)))[1]
    # Half the cuts fall after a closing brace or bracket: between calls, or just inside.
    ends = [i for i in range(1, len(text)) if text[i - 1] in "})]"]
    cut = text[:rng.choice(ends) if rng.random() < 0.5 else rng.randrange(len(text))]
    content, whole = parser_cls().extract(cut)
    sent, early, more, reason = _streamed(parser_cls(), cut, rng, "length")
    assembled = _assemble(early + more)
    if whole:  # cut between two calls
        assert (sent, reason) == ("", "length")
        assert [FunctionCall(c["name"], c["arguments"]) for c in assembled] == whole
    else:  # all of it content, the calls opened on the way as far as they were read
        assert sent == cut
        for got, call in zip(assembled, full, strict=False):
            assert got["name"] == call.name and call.arguments.startswith(got["arguments"])


@pytest.mark.parametrize("name", list(PARSERS))
def test_responses_events_carry_the_streamed_calls(name):
    """The Responses API's function_call items, from the same stream: each opened in turn,
    its arguments in delta events, closed with the whole output's arguments."""
    rng = random.Random(7)
    parser_cls, render = PARSERS[name]
    text = render(rng, _calls(rng) + [("now", {"a": [1, "x)"]})])
    _, whole = parser_cls().extract(text)
    split, events = OutputSplit(ToolCalls("auto", parser_cls()), None).stream(), ResponseEvents()
    kinds, i = [], 0
    while i < len(text):
        piece, i = text[i:i + 3], i + 3
        for delta in split.feed(piece, "stop" if i >= len(text) else None)[2]:
            before = events.current
            kinds += [(e.type, getattr(e, "output_index", None)) for e in events.call(delta)]
            assert isinstance(delta, tuple) == (events.current is before)
    kinds += [(e.type, getattr(e, "output_index", None)) for e in events.close()]
    assert [(item.name, item.arguments) for item in events.items] == [
        (c.name, c.arguments) for c in whole]
    done = [index for kind, index in kinds if kind == "response.function_call_arguments.done"]
    assert done == list(range(len(whole)))
    # A delta is always for the call whose item is open (the last announced).
    opened = -1
    for kind, index in kinds:
        if kind == "response.output_item.added":
            opened = index
        elif kind == "response.function_call_arguments.delta":
            assert index == opened
