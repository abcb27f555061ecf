"""The reasoning parsers on text alone: a whole output's (reasoning, content), and a stream
fed the same text in pieces of any size sending the same, with no part of a tag in either."""

from __future__ import annotations

import pytest

from loom.entrypoints.openai.reasoning import REASONING_PARSERS, ReasoningStream
from tests.entrypoints.conftest import forced, streamed

CASES = [
    ("qwen3", "<think>\nIt is in France.\n</think>\n\nParis.", "\nIt is in France.\n", "Paris."),
    ("qwen3", "  <think>a < b </th is not a tag</think>Yes", "a < b </th is not a tag", "Yes"),
    ("qwen3", "Paris.", None, "Paris."),  # enable_thinking false: no <think>
    ("qwen3", "<think>cut short by max_tok", "cut short by max_tok", None),
    ("qwen3", "<think>done</think>\n\n", "done", None),
    ("qwen3", "<thin", None, "<thin"),
    ("deepseek_r1", "It is in France.</think>\n\nParis.", "It is in France.", "Paris."),
    ("deepseek_r1", "<think>It is in France.</think>Paris.", "It is in France.", "Paris."),
    ("deepseek_r1", "still thinking", "still thinking", None),
]


@pytest.mark.parametrize("name, text, reasoning, content", CASES)
def test_split(name, text, reasoning, content):
    assert REASONING_PARSERS[name].split(text) == (reasoning, content)


@pytest.mark.parametrize("name, text, reasoning, content", CASES)
@pytest.mark.parametrize("size", [1, 2, 3, 1000])
def test_stream_sends_the_same_split(name, text, reasoning, content, size):
    stream = ReasoningStream(REASONING_PARSERS[name])
    got_reasoning = got_content = ""
    for i in range(0, len(text), size):
        r, c = stream.feed(text[i:i + size])
        got_reasoning, got_content = got_reasoning + r, got_content + c
        if reasoning is not None:
            assert "<think>" not in got_reasoning and "</think" not in got_reasoning + got_content
    r, c = stream.end()
    assert (got_reasoning + r, got_content + c) == (reasoning or "", content or "")


@pytest.mark.parametrize("seed", range(60))
def test_random_streams_send_the_whole_split(seed):
    """Texts of tags, parts of tags, whitespace and words, cut at random: a stream sends
    what the whole output's split holds."""
    import random
    rng = random.Random(seed)
    name = rng.choice(list(REASONING_PARSERS))
    words = ["<think>", "</think>", "</th", "<", "</", " ", "\n", "ok", "a<b", "think>"]
    text = "".join(rng.choice(words) for _ in range(rng.randrange(1, 25)))
    reasoning, content = REASONING_PARSERS[name].split(text)
    stream, got, cut = ReasoningStream(REASONING_PARSERS[name]), ["", ""], 0
    while cut < len(text):
        piece = text[cut:cut + rng.randrange(1, 6)]
        cut += len(piece)
        got = [a + b for a, b in zip(got, stream.feed(piece))]
    got = [a + b for a, b in zip(got, stream.end())]
    assert got == [reasoning or "", content or ""], (name, text)


# -- over HTTP: a server started with --reasoning-parser qwen3 --------------------------------

THOUGHT = "<think>\nIt is in France.\n</think>\n\nParis."


def test_reasoning_reaches_its_own_field(parsing_server):
    client = parsing_server.client()
    model = client.models.list().data[0].id
    kw = dict(model=model, messages=[{"role": "user", "content": "Capital of France?"}],
              max_tokens=40, temperature=0, extra_body=forced(THOUGHT))
    message = client.chat.completions.create(**kw).choices[0].message
    assert (message.reasoning, message.content) == ("\nIt is in France.\n", "Paris.")
    content, calls, finish, reasoning = streamed(client.chat.completions.create(stream=True,
                                                                                **kw))
    assert (reasoning, content, calls, finish) == ("\nIt is in France.\n", "Paris.", [], "stop")
    kw["extra_body"] = {**kw["extra_body"], "include_reasoning": False}
    message = client.chat.completions.create(**kw).choices[0].message
    assert (getattr(message, "reasoning", None), message.content) == (None, "Paris.")


def test_thinking_then_a_tool_call(parsing_server):
    client = parsing_server.client()
    model = client.models.list().data[0].id
    tools = [{"type": "function", "function": {"name": "capital", "parameters": {
        "type": "object", "properties": {"country": {"type": "string"}}}}}]
    text = ('<think>Look it up.</think>\n<tool_call>\n{"name": "capital", "arguments": '
            '{"country": "France"}}\n</tool_call>')
    kw = dict(model=model, messages=[{"role": "user", "content": "Capital of France?"}],
              tools=tools, max_tokens=60, temperature=0, extra_body=forced(text))
    choice = client.chat.completions.create(**kw).choices[0]
    assert (choice.message.reasoning, choice.message.content) == ("Look it up.", None)
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("capital", '{"country": "France"}')]
    content, calls, finish, reasoning = streamed(client.chat.completions.create(stream=True,
                                                                                **kw))
    assert (reasoning, content, finish) == ("Look it up.", "", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in calls] == [("capital", '{"country": "France"}')]


def test_an_earlier_turns_reasoning_reaches_the_template_under_its_name():
    from loom.entrypoints.openai.protocol_chat import ChatMessage
    message = ChatMessage(role="assistant", content="Paris.", reasoning="It is in France.")
    assert message.for_template()["reasoning_content"] == "It is in France."
