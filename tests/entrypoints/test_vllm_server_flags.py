"""vLLM's server flags that `vllm serve` command lines carry: --response-role, --root-path,
--disable-fastapi-docs, --enable-server-load-tracking with GET /load,
--chat-template-content-format, --return-tokens-as-token-ids, --enable-force-include-usage,
--enable-request-id-headers, and --disable-log-requests beside --enable-log-requests.
Flags are checked in this process; one in-process server shows them served."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from loom.frontend.chat_content import detect_content_format
from tests.entrypoints.conftest import API_KEY, start_server
from tests.test_cli import _main_error

BASE = ["serve", "llama-3.1-8b", "--load-format", "dummy", "--device", "cpu"]


def _options(monkeypatch, *flags: str):
    from loom.cli import main
    from loom.entrypoints.openai import launcher
    seen = {}
    monkeypatch.setattr(launcher, "run_server",
                        lambda options, config, inproc: seen.update(options=options))
    main([*BASE, *flags])
    return seen["options"]


def test_server_flags_reach_the_api_server_options(monkeypatch):
    options = _options(monkeypatch)
    assert (options.response_role, options.root_path, options.fastapi_docs,
            options.server_load_tracking, options.chat_template_content_format,
            options.log_requests, options.return_tokens_as_token_ids,
            options.force_include_usage, options.request_id_headers) == (
        "assistant", "", True, False, "auto", False, False, False, False)
    options = _options(monkeypatch, "--response-role", "bot", "--root-path", "/llm/",
                       "--disable-fastapi-docs", "--enable-server-load-tracking",
                       "--chat-template-content-format", "openai", "--disable-log-requests",
                       "--return-tokens-as-token-ids", "--enable-force-include-usage",
                       "--enable-request-id-headers")
    assert options.return_tokens_as_token_ids and options.force_include_usage
    assert options.request_id_headers
    assert (options.response_role, options.root_path, options.fastapi_docs,
            options.server_load_tracking, options.chat_template_content_format,
            options.log_requests) == ("bot", "/llm", False, True, "openai", False)


@pytest.mark.parametrize("flags, logged", [
    (["--enable-log-requests"], True), (["--no-disable-log-requests"], True),
    (["--disable-log-requests"], False), (["--no-enable-log-requests"], False),
    (["--no-enable-log-requests", "--disable-log-requests"], False),
    (["--enable-log-requests", "--no-disable-log-requests"], True),
])
def test_log_requests_flags_agree(monkeypatch, flags, logged):
    """vLLM's --disable-log-requests is its older spelling of the default; the two flags
    (and their --no- forms) may be given together when they say the same."""
    assert _options(monkeypatch, *flags).log_requests is logged


@pytest.mark.parametrize("flags, message", [
    (["--enable-log-requests", "--disable-log-requests"],
     "enable_log_requests: give --enable-log-requests or --disable-log-requests, not both"),
    (["--no-enable-log-requests", "--no-disable-log-requests"], "enable_log_requests: give "),
    (["--root-path", "llm"], "root_path: must start with '/', got 'llm'"),
    (["--enable-log-outputs"], "enable_log_outputs: --enable-log-outputs needs "
                               "--enable-log-requests"),
    (["--chat-template-content-format", "xml"],
     "argument --chat-template-content-format: invalid choice: 'xml'"),
])
def test_bad_server_flags_are_one_line_errors(capsys, flags, message):
    err = _main_error(capsys, *BASE, *flags)
    assert message in err.splitlines()[-1], err


# -- served ----------------------------------------------------------------------------------
EITHER_TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{% if m.content is string %}"
                   "S:{{ m.content }}{% else %}{% for p in m.content %}P:{{ p.text }}"
                   "{% endfor %}{% endif %}\n{% endfor %}"
                   "{% if add_generation_prompt %}<assistant>{% endif %}")
"""Takes content either way, and says which it got; auto would give it parts."""
SERVED = ("--response-role", "narrator", "--root-path", "/llm", "--disable-fastapi-docs",
          "--enable-server-load-tracking", "--chat-template", EITHER_TEMPLATE,
          "--chat-template-content-format", "string", "--disable-log-requests",
          "--override-generation-config", json.dumps({"temperature": 0, "max_new_tokens": 3}),
          "--return-tokens-as-token-ids", "--enable-force-include-usage",
          "--enable-request-id-headers")
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def test_served(tiny_chat_model, tmp_path):
    server = start_server(tiny_chat_model, "inproc", tmp_path, extra_args=SERVED)
    try:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        with httpx.Client(base_url=server.url, timeout=60) as http:
            _check_root_path_and_docs(http, auth)
            _check_load_and_role(http, auth)
            rendered = http.post("/detokenize", json={"tokens": http.post(
                "/tokenize", json=CHAT).json()["tokens"]}).json()["prompt"]
            completion = http.post("/v1/completions", headers=auth, json={
                "prompt": "Once upon", "max_tokens": None, "ignore_eos": True,
                "logprobs": 1}).json()
            # a request that sets return_tokens_as_token_ids false gets the tokens' text
            texts = http.post("/v1/completions", headers=auth, json={
                "prompt": "Once upon", "max_tokens": None, "ignore_eos": True, "logprobs": 1,
                "return_tokens_as_token_ids": False}).json()["choices"][0]["logprobs"]
            ids = [int(t.removeprefix("token_id:"))
                   for t in completion["choices"][0]["logprobs"]["tokens"]]
            pieces = [http.post("/detokenize", json={"tokens": [i]}).json()["prompt"]
                      for i in ids]
            _check_request_ids(http, auth)
            streams = [_last_chunk(http, auth, path, body) for path, body in (
                ("/v1/completions", {"prompt": "Once upon", "max_tokens": None}),
                ("/v1/chat/completions", CHAT))]
    finally:
        assert server.stop() == 0
    assert detect_content_format(EITHER_TEMPLATE) == "openai"
    assert "<user>S:hi" in rendered, rendered  # the flag's string, not what auto detects
    assert completion["usage"]["completion_tokens"] == 3  # the overridden max_new_tokens
    # --return-tokens-as-token-ids: each "token_id:<id>" the tokenizer's own token there
    assert all(t.startswith("token_id:") for t in completion["choices"][0]["logprobs"]["tokens"])
    assert pieces == texts["tokens"] and "".join(pieces) == completion["choices"][0]["text"]
    # --enable-force-include-usage: streams that did not ask end with usage all the same
    for last in streams:
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 3, last
    assert "Received request" not in server.log_path.read_text()


def _check_request_ids(http: httpx.Client, auth: dict) -> None:
    """--enable-request-id-headers: a request's own X-Request-Id comes back, on answers,
    streams and refusals alike; one that sent none gets a fresh one each time."""
    mine = {**auth, "X-Request-Id": "my-id-7"}
    assert http.get("/v1/models", headers=mine).headers["x-request-id"] == "my-id-7"
    refused = http.get("/v1/models", headers={"X-Request-Id": "no-key"})
    assert (refused.status_code, refused.headers["x-request-id"]) == (401, "no-key")
    fresh = {http.get("/health").headers["x-request-id"] for _ in range(2)}
    assert len(fresh) == 2 and all(len(i) == 32 for i in fresh)
    # vLLM's ids: the header, else the body's request_id, is the response id's base; a
    # second request on an id still running is a 400 naming it, the first unharmed
    completion = {"prompt": "Once upon", "max_tokens": 2}
    assert http.post("/v1/completions", headers=auth, json={
        **completion, "request_id": "body-1"}).json()["id"] == "cmpl-body-1"
    assert http.post("/v1/completions", headers=mine, json={
        **completion, "request_id": "body-1"}).json()["id"] == "cmpl-my-id-7"
    body = {**CHAT, "stream": True, "max_tokens": 200, "ignore_eos": True}
    with http.stream("POST", "/v1/chat/completions", headers=mine, json=body) as stream:
        assert stream.headers["x-request-id"] == "my-id-7"
        lines = stream.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        again = http.post("/v1/chat/completions", headers=mine, json=CHAT)
        rest = [line for line in lines if line.startswith("data: ")]
    assert first["id"] == "chatcmpl-my-id-7" and rest[-1] == "data: [DONE]"
    assert again.status_code == 400 and "chatcmpl-my-id-7" in again.json()["error"]["message"]


def _last_chunk(http: httpx.Client, auth: dict, path: str, body: dict) -> dict:
    """The last chunk of a stream that sets no stream_options."""
    body = {**body, "stream": True, "ignore_eos": True}
    with http.stream("POST", path, headers=auth, json=body) as stream:
        chunks = [line[6:] for line in stream.iter_lines() if line.startswith("data: ")]
    assert chunks[-1] == "[DONE]"
    return json.loads(chunks[-2])


def _check_root_path_and_docs(http: httpx.Client, auth: dict) -> None:
    # Behind a proxy that keeps the prefix or strips it, the same routes answer, and the
    # prefixed /v1 routes need the API key as the plain ones do.
    for prefix in ("", "/llm"):
        assert http.get(f"{prefix}/v1/models", headers=auth).status_code == 200
        assert http.get(f"{prefix}/v1/models").status_code == 401
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert http.get(prefix + path).status_code == 404, path


def _check_load_and_role(http: httpx.Client, auth: dict) -> None:
    assert http.get("/load").json() == {"server_load": 0}
    # Long enough to be still streaming when /load is asked; then left, which aborts it.
    body = {**CHAT, "stream": True, "max_tokens": 4000, "ignore_eos": True}
    with http.stream("POST", "/llm/v1/chat/completions", headers=auth, json=body) as stream:
        lines = stream.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data: "))[6:])
        assert http.get("/llm/load").json() == {"server_load": 1}  # this stream
    assert first["choices"][0]["delta"]["role"] == "narrator"
    deadline = time.monotonic() + 30
    while http.get("/load").json() != {"server_load": 0}:  # once the server sees it gone
        assert time.monotonic() < deadline, "the abandoned stream is still counted"
        time.sleep(0.05)
    reply = http.post("/v1/chat/completions", headers=auth, json=CHAT).json()
    assert reply["choices"][0]["message"]["role"] == "narrator"
    # Without the generation prompt the model continues the last message, and keeps its role.
    reply = http.post("/v1/chat/completions", headers=auth,
                      json={**CHAT, "add_generation_prompt": False}).json()
    assert reply["choices"][0]["message"]["role"] == "user"


# -- --config FILE ---------------------------------------------------------------------------
def _served_with(monkeypatch, *argv: str):
    from loom.cli import main
    from loom.entrypoints.openai import launcher
    seen = {}
    monkeypatch.setattr(launcher, "run_server", lambda options, config, inproc: seen.update(
        options=options, config=config))
    main(list(argv))
    return seen["options"], seen["config"]


def test_config_file_options_under_the_command_line(monkeypatch, tmp_path):
    """vLLM's --config: a YAML file's options by name (either spelling), read before the
    command line, whose flags win; false for a --no- flag, lists to several values, a
    mapping as JSON, `model` for the positional."""
    path = tmp_path / "serve.yaml"
    path.write_text("model: llama-3.1-8b\nload_format: dummy\ndevice: cpu\n"
                    "max_model_len: 512\nenable-prefix-caching: false\n"
                    "served_model_name: [a, b]\ncompilation_config: {level: 0}\n"
                    "disable_fastapi_docs: true\nenable_force_include_usage: false\n")
    options, config = _served_with(monkeypatch, "serve", "--config", str(path),
                                   "--max-model-len", "256")
    assert (config.model.model, config.model.max_model_len, config.cache.enable_prefix_caching,
            config.compilation.level) == ("llama-3.1-8b", 256, False, 0)
    assert (options.served_model_names, options.fastapi_docs,
            options.force_include_usage) == (["a", "b"], False, False)
    # the positional MODEL over the file's
    _, config = _served_with(monkeypatch, "serve", "qwen3-30b-a3b", f"--config={path}")
    assert (config.model.model, config.model.max_model_len) == ("qwen3-30b-a3b", 512)


@pytest.mark.parametrize("text, message", [
    ("max_model_len: 512\nwarp_speed: 9\n",
     "config: 'warp_speed' is not an option of loom serve"),
    ("- max_model_len\n", "must hold a mapping of options, got list"),
    ("max_model_len: [1\n", "is not valid YAML"),
    (None, "config: cannot read"),
])
def test_bad_config_files_are_one_line_errors(capsys, tmp_path, text, message):
    path = tmp_path / "serve.yaml"
    if text is not None:
        path.write_text(text)
    err = _main_error(capsys, "serve", "--config", str(path))
    assert message in err.splitlines()[-1], err
