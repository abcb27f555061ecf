"""`loom serve --skip-tokenizer-init` (vLLM's): no tokenizer is loaded, so prompts are
token ids and outputs carry ids, not text; what needs a tokenizer is a 400 naming it. The
offline LLM on the same model, which has its tokenizer, gives the reference ids."""

from __future__ import annotations

import pytest

from loom import SamplingParams
from tests.entrypoints.conftest import API_KEY, start_server
from tests.test_cli import _main_error

PROMPT = [1, 42, 7, 300, 5]
AUTH = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture(scope="module")
def bare_server(tiny_chat_model, tmp_path_factory):
    s = start_server(tiny_chat_model, "inproc", tmp_path_factory.mktemp("skip-logs"),
                     extra_args=("--skip-tokenizer-init",))
    yield s
    assert s.stop() == 0, s.log_tail()


def test_token_id_prompts_generate_what_the_offline_engine_does(bare_server, llm):
    with bare_server.http(timeout=60, headers=AUTH) as http:
        body = http.post("/v1/completions", json={
            "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "logprobs": 0}).json()
    choice = body["choices"][0]
    ids = [int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
    reference = llm.generate([{"prompt_token_ids": PROMPT}],
                             SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                             use_tqdm=False)[0].outputs[0]
    assert ids == list(reference.token_ids) and reference.text  # the LLM has its tokenizer
    assert choice["text"] == "" and body["usage"]["completion_tokens"] == 6
    assert "skip_tokenizer_init: no tokenizer" in bare_server.log_tail(200)


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "hello", "max_tokens": 2}, "prompt"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "stop": ["x"]}, "stop"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "messages"),
    ("/tokenize", {"prompt": "hi"}, "tokenizer")])
def test_what_needs_a_tokenizer_is_refused_by_name(bare_server, path, body, param):
    with bare_server.http(timeout=60, headers=AUTH) as http:
        r = http.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_chat_template_without_a_tokenizer_is_one_cli_line(capsys, tiny_chat_model):
    err = _main_error(capsys, "serve", tiny_chat_model, "--skip-tokenizer-init", "--device",
                      "cpu", "--chat-template", "{{ messages }}")
    assert "chat_template: needs a tokenizer (--skip-tokenizer-init)" in err
