"""The operator's side of `loom serve`, on one server: --enable-sleep-mode with
LOOM_SERVER_DEV_MODE=1 (vLLM's /sleep, /wake_up, /is_sleeping and /collective_rpc, driven
with the official openai client beside them: a request that arrives asleep waits for the
wake-up, and its answer is the offline LLM's), --middleware, /tokenizer_info,
--log-error-stack and --exclude-tools-when-tool-choice-none."""

from __future__ import annotations

import concurrent.futures
import json
import os
import time

import pytest

from loom import SamplingParams
from tests.entrypoints.conftest import API_KEY, start_server

PROMPT = "Sleep test: the weather today"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def dev_server(tiny_chat_model, tmp_path_factory):
    s = start_server(tiny_chat_model, "mp", tmp_path_factory.mktemp("sleep-logs"),
                     extra_env={"LOOM_SERVER_DEV_MODE": "1"},
                     extra_args=("--enable-sleep-mode", "--enable-tokenizer-info-endpoint",
                                 "--middleware", "tests.entrypoints.user_middleware.stamp",
                                 "--middleware", "tests.entrypoints.user_middleware.Stamp",
                                 "--log-error-stack", "--trust-request-chat-template",
                                 "--exclude-tools-when-tool-choice-none",
                                 "--tool-parser-plugin", "tests/entrypoints/angle_parser.py",
                                 "--enable-auto-tool-choice", "--tool-call-parser",
                                 "angle_calls"))
    yield s
    assert s.stop() == 0, s.log_tail()


@pytest.fixture(scope="module")
def expected(llm) -> str:
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True), use_tqdm=False)
    return out[0].outputs[0].text


def _complete(server) -> str:
    client = server.client()
    model = client.models.list().data[0].id
    answer = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                       temperature=0, extra_body={"ignore_eos": True})
    return answer.choices[0].text


def _post(server, path: str, **kwargs):
    with server.http(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as http:
        return http.post(path, **kwargs)


def _sleeping(server) -> bool:
    with server.http(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        return http.get("/is_sleeping").json()["is_sleeping"]


def test_a_request_sent_asleep_waits_for_the_wake_up(dev_server, expected):
    assert _complete(dev_server) == expected and not _sleeping(dev_server)
    assert _post(dev_server, "/sleep", params={"level": 1}).status_code == 200
    assert _sleeping(dev_server)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_complete, dev_server)
        time.sleep(1.0)
        assert not waiting.done()  # accepted, held until the wake-up
        assert _post(dev_server, "/wake_up").status_code == 200
        assert waiting.result(timeout=60) == expected
    assert not _sleeping(dev_server)


def test_level_2_then_reload_weights_by_collective_rpc(dev_server, expected):
    assert _post(dev_server, "/sleep", params={"level": 2}).status_code == 200
    assert _post(dev_server, "/wake_up", params={"tags": "weights"}).status_code == 200
    assert _sleeping(dev_server)  # the KV cache still sleeps
    reply = _post(dev_server, "/collective_rpc", json={"method": "reload_weights"})
    assert reply.status_code == 200 and reply.json() == {"results": [None]}
    info = _post(dev_server, "/collective_rpc", json={"method": "model_info"}).json()
    assert info["results"][0]["vocab_size"] > 0
    assert _post(dev_server, "/wake_up", params={"tags": "kv_cache"}).status_code == 200
    assert not _sleeping(dev_server)
    assert _complete(dev_server) == expected


@pytest.mark.parametrize("path, kwargs, message", [
    ("/sleep", {"params": {"level": 5}}, "sleep.level: must be 0, 1 or 2, got 5"),
    ("/sleep", {"params": {"mode": "soon"}}, "sleep.mode: must be one of abort, wait, keep"),
    ("/sleep", {"params": {"tags": "lora"}}, "sleep.tags: 'lora' is not a memory tag"),
    ("/wake_up", {"params": {"tags": "kv"}}, "wake_up.tags: 'kv' is not a memory tag"),
    ("/collective_rpc", {"json": {"method": "launch"}}, "'launch' is not a worker method"),
    ("/collective_rpc", {"json": {"args": []}}, "method: a worker method's name is required"),
    ("/collective_rpc", {"json": {"method": "model_info", "args": {}}}, "args: must be"),
    ("/collective_rpc", {"json": {"method": "model_info", "timeout": 3}}, "timeout: loom"),
])
def test_bad_dev_requests_are_400s_with_an_openai_error(dev_server, expected, path, kwargs,
                                                        message):
    reply = _post(dev_server, path, **kwargs)
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"]
    assert not _sleeping(dev_server)
    assert _complete(dev_server) == expected  # the engine lives on, unchanged


def test_operator_middleware_wraps_every_answer_refusals_included(dev_server):
    with dev_server.http() as http:  # no API key: refused by loom's own middleware
        refused = http.get("/v1/models")
    assert refused.status_code == 401
    assert refused.headers["x-operator-function"] == "/v1/models"
    assert refused.headers["x-operator-class"] == "1"


def test_tokenizer_info_is_the_tokenizers_config(dev_server, tiny_chat_model):
    with open(os.path.join(tiny_chat_model, "tokenizer_config.json")) as f:
        config = json.load(f)
    with dev_server.http(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        info = http.get("/tokenizer_info").json()
    with open(os.path.join(tiny_chat_model, "chat_template.jinja")) as f:
        assert info["chat_template"] == f.read()  # (transformers' file beside the config)
    assert info["tokenizer_class"] == config.get("tokenizer_class", "PreTrainedTokenizerFast")
    assert {k: v for k, v in info.items() if k in config} == config


@pytest.mark.parametrize("path, message", [
    ("tests.entrypoints.user_middleware.missing", "cannot import "
     "'tests.entrypoints.user_middleware.missing'"),
    ("stamp", "must be an import path module.name, got 'stamp'"),
    ("tests.entrypoints.user_middleware.NOT_MIDDLEWARE", "must be an ASGI middleware class or "
     "an async function"),
])
def test_a_bad_middleware_path_is_one_line_before_anything_loads(capsys, path, message):
    from loom.cli import main
    assert main(["serve", "no-such-model", "--middleware", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith("loom serve: error: middleware: ") and message in err, err
    assert len(err.strip().splitlines()) == 1, err


TOOLS_TEMPLATE = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                  "{% if tools %}{% for t in tools %}TOOL {{ t['function']['name'] }} "
                  "{{ t['function']['description'] }}\n{% endfor %}{% endif %}")
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "the weather "
        "in a city, today and for the days to come", "parameters": {"type": "object"}}}


def test_tool_choice_none_renders_no_tools_with_the_flag(dev_server):
    client = dev_server.client()
    model = client.models.list().data[0].id

    def prompt_tokens(**kwargs) -> int:
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
            max_tokens=1, extra_body={"chat_template": TOOLS_TEMPLATE}, **kwargs)
        return answer.usage.prompt_tokens
    plain = prompt_tokens()
    assert prompt_tokens(tools=[TOOL], tool_choice="none") == plain
    assert prompt_tokens(tools=[TOOL], tool_choice="required") > plain + 10


def test_log_error_stack_logs_a_400s_stack(dev_server):
    reply = _post(dev_server, "/sleep", params={"level": 7})
    assert reply.status_code == 400
    for _ in range(50):  # (the log is written by the server's process)
        log = dev_server.log_path.read_text()
        if "error answer 400: sleep.level" in log:
            break
        time.sleep(0.1)
    tail = log[log.index("error answer 400: sleep.level"):]
    assert "Traceback" in tail and "ValueError: sleep.level" in tail


def test_a_plugins_tool_parser_reads_the_calls(dev_server):
    """--tool-parser-plugin: the API server process ran the file, so --tool-call-parser
    angle_calls (tests/entrypoints/angle_parser.py) reads <call> blocks, whole and streamed."""
    from tests.entrypoints.conftest import forced
    client = dev_server.client()
    tools = [{"type": "function", "function": {"name": "now", "description": "The time"}}]
    kw = dict(model=client.models.list().data[0].id, tools=tools, max_tokens=40,
              temperature=0, messages=[{"role": "user", "content": "Time?"}],
              extra_body=forced('Let me see.<call>{"name": "now", "arguments": {}}</call>'))
    whole = client.chat.completions.create(**kw).choices[0]
    assert (whole.finish_reason, whole.message.content) == ("tool_calls", "Let me see.")
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == [
        ("now", "{}")]
    names = [d.function.name for chunk in client.chat.completions.create(stream=True, **kw)
             for choice in chunk.choices for d in choice.delta.tool_calls or []
             if d.function and d.function.name]
    assert names == ["now"]
