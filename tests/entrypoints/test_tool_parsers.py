"""The tool-call parsers and the tool-call plumbing on text alone: what a finished output
holds, and that a stream fed the same text in pieces of any size sends the same content and
calls, with nothing of a call's markup sent as content."""

from __future__ import annotations

import json

import pytest

from loom.entrypoints.openai.tool_calls import ToolCalls, check_tools, tool_schema
from loom.entrypoints.openai.tool_parsers import (FunctionCall, HermesParser, Llama3JsonParser,
                                                 PythonicParser)

WEATHER = FunctionCall("get_weather", '{"city": "Paris", "days": 2}')

# (parser, text, expected content, expected calls)
CASES = [
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": '
               '{"city": "Paris", "days": 2}}\n</tool_call>\n',
     "Let me look.\n", [WEATHER]),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}'
               '</tool_call>\n<tool_call>{"name": "now", "arguments": {}}</tool_call>',
     None, [WEATHER, FunctionCall("now", "{}")]),
    # The final block may be left open (generation stopped at its end marker).
    ("hermes", '<tool_call>{"name": "now", "arguments": {}}', None, [FunctionCall("now", "{}")]),
    ("hermes", "<tool_call> no json </tool_call>", "<tool_call> no json </tool_call>", []),
    ("hermes", "A plain answer, with < and <tool", "A plain answer, with < and <tool", []),
    # Keys json refuses (a raw control character, a bad escape) are content, never an error.
    ("hermes", '<tool_call>{"na\nme": "now", "a\\q": {}}</tool_call>',
     '<tool_call>{"na\nme": "now", "a\\q": {}}</tool_call>', []),
    ("llama3_json", '{"name": "now", "a\\q": 1, "parameters": {"\t": 1}}',
     '{"name": "now", "a\\q": 1, "parameters": {"\t": 1}}', []),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", '
                    '"days": 2}}; {"name": "now", "parameters": {}}',
     None, [WEATHER, FunctionCall("now", "{}")]),
    ("llama3_json", ' {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}',
     None, [WEATHER]),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3_json", '{"name": "now", "parameters": {}} and then text',
     '{"name": "now", "parameters": {}} and then text', []),
    ("llama3_json", "It is sunny {in Paris}.", "It is sunny {in Paris}.", []),
    ("pythonic", '[get_weather(city="Paris", days=2), now()]', None,
     [WEATHER, FunctionCall("now", "{}")]),
    ("pythonic", "<|python_start|>[f(a=[1, (2, 3)], b={'k': None}, c=true)]<|python_end|>",
     None, [FunctionCall("f", '{"a": [1, [2, 3]], "b": {"k": null}, "c": true}')]),
    ("pythonic", "[get_weather('Paris')]", "[get_weather('Paris')]", []),  # positional
    ("pythonic", "[f(a=open('x'))]", "[f(a=open('x'))]", []),  # not a literal
    ("pythonic", "[1, 2]", "[1, 2]", []),
    ("pythonic", "Sunny [mostly].", "Sunny [mostly].", []),
]
PARSERS = {"hermes": HermesParser, "llama3_json": Llama3JsonParser, "pythonic": PythonicParser}


@pytest.mark.parametrize("name, text, content, calls", CASES)
def test_extract(name, text, content, calls):
    assert PARSERS[name]().extract(text) == (content, calls)


def _assemble(deltas) -> list[dict]:
    """Calls as a client puts them together: a ToolCall opens one, (index, text) extends
    its arguments."""
    calls: list[dict] = []
    for d in deltas:
        if isinstance(d, tuple):
            calls[d[0]]["arguments"] += d[1]
        else:
            assert d.index == len(calls)
            calls.append({"id": d.id, "name": d.function.name, "arguments": d.function.arguments})
    return calls


# Outputs that a stream reads as calls until they prove not to be (the whole output has
# none): the calls it opened on the way stay, and all the text goes out as content.
STRAY = {'{"name": "now", "parameters": {}} and then text': ["now"],
         '{"name": "now", "a\\q": 1, "parameters": {"\t": 1}}': ["now"],
         "[get_weather('Paris')]": ["get_weather"], "[f(a=open('x'))]": ["f"]}


@pytest.mark.parametrize("name, text, content, calls", CASES)
@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_stream_sends_what_the_whole_output_holds(name, text, content, calls, size):
    tools = ToolCalls("auto", PARSERS[name]())
    stream = tools.stream()
    sent, early = "", []
    for i in range(0, len(text), size):
        piece, deltas = stream.feed(text[i:i + size])
        early += deltas
        sent += piece
        assert "<tool_call" not in sent and "<|python_" not in sent
    rest, deltas, reason = stream.end("stop")
    assert sent + rest == (content or "") if calls else sent + rest == text
    assembled = _assemble(early + deltas)
    if text in STRAY:  # a call opened piece by piece stays; one read whole is never opened
        names = [c["name"] for c in assembled]
        assert names == STRAY[text] if size == 1 else names in ([], STRAY[text])
    else:
        assert [FunctionCall(c["name"], c["arguments"]) for c in assembled] == calls
        assert len({c["id"] for c in assembled}) == len(calls)
        # Each call goes out as it is written: opened before the output ends.
        assert len(_assemble(early)) == len(calls)
    assert reason == ("tool_calls" if calls else "stop")


def test_hermes_streams_names_then_arguments_as_written():
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris", '
            '"x": [1, {"y": "}"}]}}\n</tool_call>')
    stream = ToolCalls("auto", HermesParser()).stream()
    seen = []
    for i in range(len(text)):
        seen.append(stream.feed(text[i])[1])
    opened = next(k for k, d in enumerate(seen) if d)
    assert text[:opened + 1].endswith('"get_weather"')  # the name, once whole
    assert seen[opened][0].function == FunctionCall("get_weather", "")
    args = "".join(d[0][1] for d in seen[opened + 1:] if d)
    assert args == '{"city": "Pa\\"ris", "x": [1, {"y": "}"}]}'
    assert json.loads(args) == {"city": 'Pa"ris', "x": [1, {"y": "}"}]}
    assert stream.end("stop")[1:] == ([], "tool_calls")


def test_hermes_stream_cut_off_in_a_call_ends_with_the_rest_as_content():
    """As a whole response has it (no calls, all text content), nothing the model wrote is
    dropped; the call opened on the way stays as far as it was read."""
    text = 'Sure. <tool_call>{"name": "now", "arguments": {"a": [1, '
    stream = ToolCalls("auto", HermesParser()).stream()
    content, deltas = stream.feed(text)
    assert content == "Sure. " and _assemble(deltas) == [
        {"id": deltas[0].id, "name": "now", "arguments": '{"a": [1, '}]
    assert stream.end("length") == (text[len("Sure. "):], [], "length")
    assert ToolCalls("auto", HermesParser()).whole(text, "length") == (text, [], "length")


def test_parallel_false_streams_the_first_call_only():
    text = CASES[1][1]
    stream = ToolCalls("auto", HermesParser(), parallel=False).stream()
    deltas = [d for i in range(len(text)) for d in stream.feed(text[i])[1]]
    rest, more, reason = stream.end("stop")
    assert [c["name"] for c in _assemble(deltas + more)] == ["get_weather"]


def test_whole_keeps_length_and_parallel_false_keeps_the_first_call():
    text = CASES[1][1]
    content, calls, reason = ToolCalls("auto", HermesParser()).whole(text, "length")
    assert [c.function for c in calls] == CASES[1][3] and reason == "length"
    content, calls, reason = ToolCalls("auto", HermesParser(), parallel=False).whole(text, "stop")
    assert [c.function for c in calls] == [WEATHER] and reason == "tool_calls"


def test_required_and_named_outputs():
    required = ToolCalls("required")
    _, calls, reason = required.whole('[{"name":"get_weather","parameters":{"city":"Paris",'
                                      '"days":2}},{"name":"now","parameters":{}}]', "stop")
    assert [c.function for c in calls] == [WEATHER, FunctionCall("now", "{}")]
    assert reason == "tool_calls"
    # Cut short by max_tokens: no calls, the text is the content.
    assert required.whole('[{"name":"now","para', "length") == ('[{"name":"now","para', [],
                                                                 "length")
    named = ToolCalls("named", name="get_weather")
    content, calls, reason = named.whole('{"city":"Paris"}', "stop")
    assert content is None and reason == "stop"
    assert [c.function for c in calls] == [FunctionCall("get_weather", '{"city":"Paris"}')]
    stream = named.stream()
    _, opening = stream.feed('{"ci')
    _, more = stream.feed('ty":"Paris"}')
    assert [d.function for d in opening] == [FunctionCall("get_weather", '{"ci')]
    assert more == [(0, 'ty":"Paris"}')] and stream.feed("") == ("", [])


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"$ref": "#/$defs/City"}},
            "$defs": {"City": {"enum": ["Paris", "Rome"]}}}}},
         {"type": "function", "function": {"name": "now"}}]


def test_required_schema_moves_definitions_to_the_root():
    schema = tool_schema(TOOLS, "required", False)
    assert schema["$defs"] == {"City": {"enum": ["Paris", "Rome"]}}
    assert schema["maxItems"] == 1 and schema["minItems"] == 1
    options = schema["items"]["anyOf"]
    assert [o["properties"]["name"] for o in options] == [{"enum": ["get_weather"]},
                                                         {"enum": ["now"]}]
    assert "$defs" not in options[0]["properties"]["parameters"]
    assert tool_schema(TOOLS, {"type": "function", "function": {"name": "now"}}, None) == {
        "type": "object", "properties": {}}
    assert tool_schema(TOOLS, "auto", None) is None and tool_schema(TOOLS, "none", None) is None


@pytest.mark.parametrize("tools, choice, message", [
    (None, "auto", "tool_choice: needs tools"),
    (TOOLS, "any", "tool_choice: must be"),
    (TOOLS, {"type": "function", "function": {"name": "missing"}},
     "tool_choice.function.name: 'missing' is not among the tools"),
    (TOOLS, {"name": "now"}, "tool_choice: a named tool choice is"),
    ([{"type": "retrieval"}], "none", "tools.0.type"),
    ([{"type": "function", "function": {"parameters": {}}}], None, "tools.0.function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}], None,
     "tools.0.function.parameters"),
])
def test_bad_tools_name_the_field(tools, choice, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_tools(tools, choice)


def test_auto_needs_a_parser():
    with pytest.raises(ValueError, match="--enable-auto-tool-choice"):
        ToolCalls.for_request(TOOLS, None, None, None)
    assert ToolCalls.for_request(TOOLS, "none", None, None).mode == "none"
    assert json.loads(json.dumps(tool_schema(TOOLS, "required", None)))  # plain JSON


PLUGIN = "tests/entrypoints/angle_parser.py"


def test_a_tool_parser_plugin_registers_its_parser(tmp_path, capsys, monkeypatch):
    """--tool-parser-plugin FILE (vLLM's flag; loom's parser interface): the file's
    registered parser is a --tool-call-parser name; bad files and names are one-line CLI
    errors. (A served one: tests/entrypoints/test_operator_server.py.)"""
    from loom.cli import main
    from loom.entrypoints.openai import launcher, tool_parser_plugin, tool_parsers
    from tests.test_cli import _main_error
    plugin = PLUGIN
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    base = ["serve", "llama-3.1-8b", "--load-format", "dummy", "--device", "cpu"]
    assert "tool_parser_plugin: no file" in _main_error(
        capsys, *base, "--tool-parser-plugin", str(tmp_path / "nope.py"))
    assert "failed to import: RuntimeError: boom" in _main_error(
        capsys, *base, "--tool-parser-plugin", str(broken))
    assert "tool_call_parser: 'angle_calls' is not one of" in _main_error(
        capsys, *base, "--enable-auto-tool-choice", "--tool-call-parser", "angle_calls")
    assert "failed to import" in _main_error(  # not run again: the same error
        capsys, *base, "--tool-parser-plugin", str(broken))
    seen = {}
    monkeypatch.setattr(launcher, "run_server",
                        lambda options, config, inproc: seen.update(options=options))
    # Registered in this process: gone again after the test.
    monkeypatch.setitem(tool_parsers.TOOL_PARSERS, "angle_calls", None)
    monkeypatch.setattr(tool_parser_plugin, "_LOADED", {})
    main([*base, "--tool-parser-plugin", plugin, "--enable-auto-tool-choice",
          "--tool-call-parser", "angle_calls"])
    assert (seen["options"].tool_call_parser, seen["options"].tool_parser_plugin) == (
        "angle_calls", plugin)
    tools = [{"type": "function", "function": {"name": "now", "parameters": {}}}]
    calls = ToolCalls.for_request(tools, "auto", None, "angle_calls")
    text = 'Checking.<call>{"name": "now", "arguments": {}}</call>'
    content, found, reason = calls.whole(text, "stop")
    assert (content, [c.function for c in found], reason) == (
        "Checking.", [FunctionCall("now", "{}")], "tool_calls")


def test_the_plugin_left_no_parser_behind():
    """(After the plugin test, in the same process: its registration was undone.)"""
    from loom.entrypoints.openai.tool_parsers import TOOL_PARSERS
    assert sorted(TOOL_PARSERS) == ["hermes", "llama3_json", "pythonic"]
