"""Tool calls through the official openai client, whole and streamed, on a server started
with --enable-auto-tool-choice --tool-call-parser hermes (and --reasoning-parser qwen3,
which leaves outputs without <think> alone), and on one each for llama3_json and pythonic.
The random model's text is steered with a regex (structured_outputs) or by the tool
choice's own schema, so that what it writes, and so what the calls must be, is known here."""

from __future__ import annotations

import json

import pytest

from tests.entrypoints.conftest import forced, start_server, streamed

TOOLS = [{"type": "function", "function": {
             "name": "get_weather", "description": "The weather in a city",
             "parameters": {"type": "object", "required": ["city"],
                            "properties": {"city": {"enum": ["Paris", "Rome"]}}}}},
         {"type": "function", "function": {"name": "now", "description": "The time"}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
CALL_TEXT = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
             '\n</tool_call>')


def test_auto_reads_the_models_calls(parsing_server):
    client = parsing_server.client()
    model = client.models.list().data[0].id
    kw = dict(model=model, messages=MESSAGES, tools=TOOLS, max_tokens=60, temperature=0,
              extra_body=forced(CALL_TEXT))
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls"
    assert whole.message.content == "Checking.\n"
    [call] = whole.message.tool_calls
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    content, calls, finish, _ = streamed(client.chat.completions.create(stream=True, **kw))
    assert (content, finish) == ("Checking.\n", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})]
    assert calls[0]["id"].startswith("chatcmpl-tool-")
    # As the model writes it: the call opens with its name, its arguments follow in pieces.
    pieces = [d for chunk in client.chat.completions.create(stream=True, **kw)
              for choice in chunk.choices for d in choice.delta.tool_calls or []]
    assert pieces[0].function.name == "get_weather" and pieces[0].id.startswith("chatcmpl-tool-")
    assert len(pieces) > 2 and all(p.id is None and p.function.name is None
                                   for p in pieces[1:])


def test_auto_without_a_call_is_plain_content(parsing_server):
    client = parsing_server.client()
    model = client.models.list().data[0].id
    kw = dict(model=model, messages=MESSAGES, tools=TOOLS, tool_choice="auto", max_tokens=20,
              temperature=0, extra_body=forced("It is <b>sunny</b>."))
    whole = client.chat.completions.create(**kw).choices[0]
    assert (whole.message.content, whole.message.tool_calls) == ("It is <b>sunny</b>.", None)
    assert whole.finish_reason == "stop"
    assert streamed(client.chat.completions.create(stream=True, **kw)) == (
        "It is <b>sunny</b>.", [], "stop", "")


def test_required_calls_follow_the_tools_schemas(parsing_server):
    client = parsing_server.client()
    model = client.models.list().data[0].id
    response = client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", n=3,
        temperature=1.0, seed=1, max_tokens=80, parallel_tool_calls=False)
    for choice in response.choices:
        assert choice.finish_reason == "tool_calls", choice
        [call] = choice.message.tool_calls
        allowed = [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"}),
                   ("now", {})]
        assert (call.function.name, json.loads(call.function.arguments)) in allowed, call
    content, calls, finish, _ = streamed(client.chat.completions.create(
        model=model, messages=MESSAGES, tools=TOOLS, tool_choice="required", temperature=0,
        max_tokens=80, parallel_tool_calls=False, stream=True))
    assert finish == "tool_calls" and content == "" and len(calls) == 1
    assert calls[0]["name"] in {"get_weather", "now"}


def test_named_call_streams_its_arguments(parsing_server):
    client = parsing_server.client()
    model = client.models.list().data[0].id
    kw = dict(model=model, messages=MESSAGES, tools=TOOLS, temperature=0, max_tokens=40,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "stop"  # as OpenAI: a forced call stops
    [call] = whole.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) in ({"city": "Paris"}, {"city": "Rome"})
    content, calls, finish, _ = streamed(client.chat.completions.create(stream=True, **kw))
    assert (content, finish) == ("", "stop")
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather",
                                                             call.function.arguments)]


def test_auto_tool_choice_flags_are_checked_at_start(capsys):
    from tests.test_cli import _main_error
    err = _main_error(capsys, "serve", "--enable-auto-tool-choice")
    assert "tool_call_parser: --enable-auto-tool-choice needs --tool-call-parser" in err
    assert err.count("\n") == 1
    # (checked after any --tool-parser-plugin has registered its parsers)
    assert "tool_call_parser: 'mistral' is not one of ['hermes', 'llama3_json', 'pythonic']" \
        in _main_error(capsys, "serve", "--tool-call-parser", "mistral")


# Each parser's syntax for the same two calls, as Llama models write them.
WHOLE_OUTPUT_CALLS = {
    "llama3_json": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                   '{"name": "now", "parameters": {}}',
    "pythonic": '[get_weather(city="Paris"), now()]'}


@pytest.fixture(scope="module", params=list(WHOLE_OUTPUT_CALLS))
def whole_output_server(request, tiny_chat_model, tmp_path_factory):
    s = start_server(tiny_chat_model, "inproc", tmp_path_factory.mktemp(request.param),
                     extra_args=("--enable-auto-tool-choice", "--tool-call-parser",
                                 request.param))
    yield request.param, s
    assert s.stop() == 0, s.log_tail()


def test_llama3_json_and_pythonic_calls_stream_as_written(whole_output_server):
    parser, server = whole_output_server
    client = server.client()
    kw = dict(model=client.models.list().data[0].id, messages=MESSAGES, tools=TOOLS,
              max_tokens=80, temperature=0, extra_body=forced(WHOLE_OUTPUT_CALLS[parser]))
    whole = client.chat.completions.create(**kw).choices[0]
    assert (whole.finish_reason, whole.message.content) == ("tool_calls", None)
    expected = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert [(name, json.loads(args)) for name, args in expected] == [
        ("get_weather", {"city": "Paris"}), ("now", {})]
    chunks = list(client.chat.completions.create(stream=True, **kw))
    content, calls, finish, _ = streamed(iter(chunks))
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == expected
    # As the model writes them: the first call opens (by name) before the output ends.
    opening = next(k for k, chunk in enumerate(chunks) if chunk.choices[0].delta.tool_calls)
    assert chunks[opening].choices[0].delta.tool_calls[0].function.name == "get_weather"
    assert chunks[opening].choices[0].finish_reason is None

    # /v1/responses: the same calls as function_call items, whole and through the client's
    # stream helper (which checks the events against each other).
    rkw = dict(model=kw["model"], input="Weather in Paris?", temperature=0,
               max_output_tokens=80, extra_body=kw["extra_body"],
               tools=[{"type": "function", **t["function"]} for t in TOOLS])
    response = client.responses.create(**rkw)
    assert [(i.type, i.name, i.arguments) for i in response.output] == [
        ("function_call", name, args) for name, args in expected]
    with client.responses.stream(**rkw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert [(i.name, i.arguments) for i in final.output] == expected
    assert kinds.count("response.function_call_arguments.done") == 2
