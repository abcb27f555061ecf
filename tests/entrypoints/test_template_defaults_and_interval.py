"""vLLM's --default-chat-template-kwargs (template variables under each request's own
chat_template_kwargs, wherever the server renders a chat) and --stream-interval N (a
streamed choice goes out at its first token, then every N tokens, and what is left when it
finishes). One server with both flags, two API server processes (so the options cross to
each as JSON); the parsing server (interval 1, the same parsers) is the baseline."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest

from loom.entrypoints.openai.api_server import ServerOptions
from loom.entrypoints.openai.stream_interval import Interval, every
from loom.outputs import CompletionOutput, RequestOutput
from tests.entrypoints.conftest import API_KEY, forced, start_server, streamed
from tests.test_cli import _main_error

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
            "[{{ greeting }}|{{ mood }}]{% if add_generation_prompt %}<assistant>{% endif %}")
DEFAULTS = {"greeting": "hello there", "mood": "calm"}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "required": ["city"],
                                          "properties": {"city": {"enum": ["Paris"]}}}}}]
THOUGHT_AND_CALL = ('<think>\nIt is in France, I will look.\n</think>\n\nChecking now.\n'
                    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
                    '</tool_call>')
BASE = ["serve", "llama-3.1-8b", "--load-format", "dummy", "--device", "cpu"]
FLAG = "--default-chat-template-kwargs"


@pytest.fixture(scope="module")
def interval_server(tiny_chat_model, tmp_path_factory):
    s = start_server(tiny_chat_model, "mp2", tmp_path_factory.mktemp("interval-logs"),
                     extra_args=("--chat-template", TEMPLATE, FLAG, json.dumps(DEFAULTS),
                                 "--stream-interval", "4", "--enable-auto-tool-choice",
                                 "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"))
    yield s
    assert s.stop() == 0, s.log_tail()


def _model(server) -> str:
    return server.client().models.list().data[0].id


# -- --default-chat-template-kwargs ---------------------------------------------------------

def _rendered(http: httpx.Client, **fields) -> tuple[str, int]:
    tokens = http.post("/tokenize", json={"messages": MESSAGES, **fields}).json()["tokens"]
    return http.post("/detokenize", json={"tokens": tokens}).json()["prompt"], len(tokens)


def test_defaults_reach_the_template_under_the_requests_own(interval_server):
    # A fresh connection each time, so that both API server processes answer some.
    for _ in range(6):
        with interval_server.http(timeout=60) as http:
            text, _ = _rendered(http)
            assert text.endswith("[hello there|calm]<assistant>"), text
            overridden, _ = _rendered(http, chat_template_kwargs={"greeting": "bye"})
            assert overridden.endswith("[bye|calm]<assistant>"), overridden  # key by key


def test_chat_responses_and_embeddings_render_the_defaults(interval_server):
    client = interval_server.client()
    model = _model(interval_server)
    with interval_server.http(timeout=60) as http:
        _, with_defaults = _rendered(http)
        _, overridden = _rendered(http, chat_template_kwargs={"greeting": "a much longer one"})
    assert overridden != with_defaults
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1,
                                          extra_body={"prompt_logprobs": 0})
    prompt = "".join(next(iter(p.values()))["decoded_token"]
                     for p in chat.prompt_logprobs[1:])
    assert prompt.endswith("[hello there|calm]<assistant>"), prompt
    assert chat.usage.prompt_tokens == with_defaults
    chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1, extra_body={
        "chat_template_kwargs": {"greeting": "a much longer one"}})
    assert chat.usage.prompt_tokens == overridden
    response = client.responses.create(model=model, input=MESSAGES, max_output_tokens=1)
    assert response.usage.input_tokens == with_defaults
    response = client.responses.create(model=model, input=MESSAGES, max_output_tokens=1,
                                       extra_body={"chat_template_kwargs": {
                                           "greeting": "a much longer one"}})
    assert response.usage.input_tokens == overridden
    # vLLM's chat form of /v1/embeddings, without a generation prompt by default
    with interval_server.http(timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        for kwargs in ({}, {"chat_template_kwargs": {"greeting": "a much longer one"}}):
            _, expected = _rendered(http, add_generation_prompt=False, **kwargs)
            embedded = http.post("/v1/embeddings", json={"messages": MESSAGES, **kwargs})
            assert embedded.json()["usage"]["prompt_tokens"] == expected, embedded.text


def test_a_requests_chat_template_kwarg_is_refused(interval_server):
    with interval_server.http(timeout=60) as http:
        r = http.post("/tokenize", json={"messages": MESSAGES,
                                         "chat_template_kwargs": {"chat_template": "x"}})
    assert r.status_code == 400 and "chat_template_kwargs" in r.text, r.text


@pytest.mark.parametrize("value, message", [
    ("x", "takes a JSON object, got 'x'"), ("[1]", "takes a JSON object, got '[1]'"),
    ("null", "takes a JSON object"),
    ('{"tools": [], "messages": 1}', "may not set ['messages', 'tools']"),
    ('{"add_generation_prompt": false}', "may not set ['add_generation_prompt']"),
    ('{"chat_template": "{{ 1 }}"}', "may not set ['chat_template']"),
])
def test_bad_default_kwargs_are_one_line_errors(capsys, value, message):
    err = _main_error(capsys, *BASE, FLAG, value)
    assert err.splitlines()[-1].startswith(
        f"loom serve: error: default_chat_template_kwargs: {FLAG} {message}"), err


@pytest.mark.parametrize("value", ["0", "-1"])
def test_bad_stream_intervals_are_one_line_errors(capsys, value):
    batch = ["run-batch", "-i", "in.jsonl", "-o", "out.jsonl", "--model", *BASE[1:]]
    for command in (BASE, batch):
        err = _main_error(capsys, *command, "--stream-interval", value)
        assert f"stream_interval: --stream-interval must be at least 1, got {value}" in (
            err.splitlines()[-1]), err


def test_bad_values_stop_serve_at_once():
    """As a user meets them: exit code 2 before anything loads, the flag named."""
    for flags, said in (([FLAG, "{nope"], FLAG), (["--stream-interval", "x"],
                                                   "argument --stream-interval: invalid int")):
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "loom.cli", *BASE, *flags],
                              capture_output=True, text=True,
                              timeout=60, cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert said in done.stderr.splitlines()[-1], done.stderr
        assert time.monotonic() - start < 20


def test_options_cross_to_api_processes():
    options = ServerOptions(model="m", served_model_names=["m"], tokenizer=None,
                            default_chat_template_kwargs={"enable_thinking": False, "n": [1]},
                            stream_interval=4)
    back = msgspec.json.decode(msgspec.json.encode(options), type=ServerOptions)
    assert (back.default_chat_template_kwargs, back.stream_interval) == (
        {"enable_thinking": False, "n": [1]}, 4)


# -- --stream-interval ----------------------------------------------------------------------

def _completion_chunks(server, stream_options=None, **kw
                       ) -> tuple[dict[int, list[int]], dict, list]:
    """Tokens per content chunk of each choice, the whole response, the chunks."""
    client = server.client()
    kw = {"model": _model(server), "prompt": "Once upon a time", "max_tokens": 10,
          "temperature": 0, "logprobs": 0, "extra_body": {"ignore_eos": True}, **kw}
    chunks = list(client.completions.create(stream=True, stream_options=stream_options, **kw))
    sizes: dict[int, list[int]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            sizes.setdefault(choice.index, []).append(len(choice.logprobs.tokens))
    return sizes, client.completions.create(**kw), chunks


def test_completions_stream_every_four_tokens(interval_server):
    sizes, whole, chunks = _completion_chunks(interval_server)
    assert sizes == {0: [1, 4, 4, 1]}  # the first at once, then every 4, then the rest
    content = [c.choices[0] for c in chunks]
    assert [c.finish_reason for c in content] == [None, None, None, "length"]
    assert "".join(c.text for c in content) == whole.choices[0].text
    tokens = [t for c in content for t in c.logprobs.tokens]
    assert tokens == whole.choices[0].logprobs.tokens
    assert [lp for c in content for lp in c.logprobs.token_logprobs] == pytest.approx(
        whole.choices[0].logprobs.token_logprobs, abs=1e-4)


def test_each_choice_of_each_prompt_keeps_its_own_count(interval_server):
    sizes, _, chunks = _completion_chunks(interval_server, prompt=["Once upon", "Hi"], n=2,
                                          stream_options={"include_usage": True})
    assert sizes == {i: [1, 4, 4, 1] for i in range(4)}
    assert chunks[-1].usage.completion_tokens == 40


def test_dropped_streams_abort_their_requests(interval_server):
    from tests.entrypoints.test_abort import _by_pid, _drop_streams, _wait_idle
    before = _by_pid(interval_server, 2)
    assert asyncio.run(_drop_streams(interval_server.url, 4)) == 6  # two of them with n=2
    for pid, info in _wait_idle(interval_server, 2).items():
        assert info["engine_unfinished"] == 0 and info["streams"] == 0, info
        assert info["tasks"] == before[pid]["tasks"], (before[pid], info)


def test_flags_reach_the_server_options(monkeypatch):
    from tests.entrypoints.test_vllm_server_flags import _options
    options = _options(monkeypatch)
    assert (options.default_chat_template_kwargs, options.stream_interval) == ({}, 1)
    options = _options(monkeypatch, FLAG, '{"enable_thinking": false}', "--stream-interval", "8")
    assert (options.default_chat_template_kwargs, options.stream_interval) == (
        {"enable_thinking": False}, 8)


def test_interval_one_streams_each_token(parsing_server):
    sizes, _, _ = _completion_chunks(parsing_server)
    assert sizes == {0: [1] * 10}
    chat = _chat_chunks(parsing_server)
    assert [len(c.logprobs.content) for c in chat if c.logprobs] == [1] * 10


def _chat_chunks(server, **kw) -> list:
    client = server.client()
    kw = dict(model=_model(server), messages=MESSAGES, max_tokens=10, temperature=0,
              logprobs=True, extra_body={"ignore_eos": True}, **kw)
    return [c.choices[0] for c in client.chat.completions.create(stream=True, **kw)]


def test_chat_streams_every_four_tokens(interval_server):
    client = interval_server.client()
    choices = _chat_chunks(interval_server)
    content = [c for c in choices if c.logprobs]
    assert [len(c.logprobs.content) for c in content] == [1, 4, 4, 1]
    assert content[-1].finish_reason == "length"
    whole = client.chat.completions.create(
        model=_model(interval_server), messages=MESSAGES, max_tokens=10, temperature=0,
        extra_body={"ignore_eos": True}).choices[0]
    assert "".join(c.delta.content or "" for c in choices) == whole.message.content


def test_parsers_read_the_joined_pieces(interval_server):
    """Thinking, content and a tool call streamed in pieces of four tokens add up to the
    whole message."""
    client = interval_server.client()
    kw = dict(model=_model(interval_server), messages=MESSAGES, tools=TOOLS, max_tokens=80,
              temperature=0, logprobs=True, extra_body=forced(THOUGHT_AND_CALL))
    whole = client.chat.completions.create(**kw)
    message = whole.choices[0].message
    assert message.reasoning == "\nIt is in France, I will look.\n"
    assert (message.content, whole.choices[0].finish_reason) == ("Checking now.\n",
                                                                 "tool_calls")
    chunks = list(client.chat.completions.create(stream=True, **kw))
    content, calls, finish, reasoning = streamed(iter(chunks))
    [call] = message.tool_calls
    assert (content, finish, reasoning) == (message.content, "tool_calls", message.reasoning)
    assert [(c["name"], c["arguments"]) for c in calls] == [(call.function.name,
                                                              call.function.arguments)]
    sizes = [len(c.choices[0].logprobs.content) for c in chunks
             if c.choices and c.choices[0].logprobs]
    assert sum(sizes) == whole.usage.completion_tokens and max(sizes) == 4


def test_responses_stream_every_four_tokens(interval_server):
    client = interval_server.client()
    kw = dict(model=_model(interval_server), input="Capital of France?", temperature=0,
              max_output_tokens=60, include=["message.output_text.logprobs"],
              extra_body=forced("<think>\nIt is in France, the one I know.\n</think>\n\n"
                                "Paris, the capital of France."))
    whole = client.responses.create(**kw)
    with client.responses.stream(**kw) as stream:
        deltas = [e for e in stream if e.type.endswith("_text.delta")]
        final = stream.get_final_response()
    assert final.output_text == whole.output_text == "Paris, the capital of France."
    assert [i.content[0].text for i in final.output[:1]] == ["\nIt is in France, the one I know.\n"]
    # the reasoning tokens are counted per engine step, not per piece streamed
    usage = [u.model_dump(exclude={"input_tokens_details"}) for u in (final.usage, whole.usage)]
    assert usage[0] == usage[1] and 0 < usage[0]["output_tokens_details"]["reasoning_tokens"]
    assert [lp.token for lp in final.output[1].content[0].logprobs] == [
        lp.token for lp in whole.output[1].content[0].logprobs]
    assert len(deltas) <= whole.usage.output_tokens // 4 + 3, [e.delta for e in deltas]


# -- Interval itself ------------------------------------------------------------------------

def _delta(index: int, token: int, finish: str | None = None) -> CompletionOutput:
    return CompletionOutput(index, f"<{token}>", [token], None, [{token: None}], finish)


def test_interval_joins_held_deltas():
    interval = Interval(3)
    sent = [interval.take(_delta(0, t, "stop" if t == 5 else None)) for t in range(6)]
    assert [s.token_ids if s else None for s in sent] == [[0], None, None, [1, 2, 3], None,
                                                          [4, 5]]
    assert (sent[3].text, sent[3].logprobs, sent[5].finish_reason) == (
        "<1><2><3>", [{1: None}, {2: None}, {3: None}], "stop")


def test_every_holds_each_choice_apart():
    async def outputs():
        for step in range(5):
            yield RequestOutput("r", None, [], [_delta(i, step, "length" if step == 4 else None)
                                                for i in range(2)], step == 4)

    async def sent_by(interval: int) -> list:
        return [[(o.index, o.token_ids) for o in out.outputs]
                async for out in every(outputs(), interval)]
    sent = asyncio.run(sent_by(2))
    assert sent == [[(0, [0]), (1, [0])], [(0, [1, 2]), (1, [1, 2])],
                    [(0, [3, 4]), (1, [3, 4])]]
    plain = outputs()
    assert every(plain, 1) is plain


def test_closing_every_closes_the_request_at_once():
    """A client gone mid-stream aborts its request then, not when the loop collects it."""
    closed = []

    async def outputs():
        try:
            for step in range(10):
                yield RequestOutput("r", None, [], [_delta(0, step)])
        finally:
            closed.append(True)

    async def close_after_first() -> list:
        stream = every(outputs(), 4)
        await anext(stream)
        await stream.aclose()
        return list(closed)
    assert asyncio.run(close_after_first()) == [True]
