"""A model's generation_config.json sets the sampling defaults of requests that leave them
unset, offline and served, as vLLM's `--generation-config auto` does."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import httpx
import pytest
import transformers as tf

from loom import LLM, SamplingParams
from loom.entrypoints.openai.protocol_completions import CompletionRequest
from loom.entrypoints.openai.protocol_chat import ChatCompletionRequest
from loom.models.loader import generation_defaults
from tests.conftest import hf_greedy
from tests.entrypoints.conftest import API_KEY, MAX_MODEL_LEN, start_server
from tests.test_cli import _main_error

RECOMMENDED = {"temperature": 0.0, "top_p": 0.9, "top_k": 7, "repetition_penalty": 1.0,
               "max_new_tokens": 5, "do_sample": True}


def _with_generation_config(src: str, dst) -> str:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    (dst / "generation_config.json").write_text(json.dumps(RECOMMENDED))
    return str(dst)


def test_offline_defaults_follow_generation_config(tiny_llama_with_tokenizer, tmp_path):
    src, hf_model = tiny_llama_with_tokenizer
    path = _with_generation_config(src, tmp_path)
    reference = tf.GenerationConfig.from_pretrained(path)  # transformers' own reading
    llm = LLM(path, dtype="float32", device="cpu", max_model_len=64)
    try:
        defaults = llm.get_default_sampling_params()
        assert (defaults.temperature, defaults.top_p, defaults.top_k, defaults.max_tokens) == (
            reference.temperature, reference.top_p, reference.top_k, reference.max_new_tokens)
        ids = llm.get_tokenizer().encode("The quick brown fox")
        out = llm.generate([ids], use_tqdm=False)[0].outputs[0].token_ids  # no params given
        assert out == hf_greedy(hf_model, ids, 5)  # temperature 0 from the file: greedy
        sampled = llm.generate([ids], SamplingParams(max_tokens=3, seed=1), use_tqdm=False)
        assert len(sampled[0].outputs[0].token_ids) == 3  # given params are the user's own
    finally:
        llm.shutdown()


def test_request_fields_override_the_defaults():
    defaults = {"temperature": 0.0, "top_k": 7, "max_tokens": 5}
    params = CompletionRequest(prompt="x").to_sampling_params(16, defaults)
    assert (params.temperature, params.top_k, params.max_tokens) == (0.0, 7, 16)
    params = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}],
                                   temperature=0.5).to_sampling_params(16, defaults)
    assert (params.temperature, params.top_k) == (0.5, 7)


def test_served_defaults_follow_generation_config(tiny_chat_model, tmp_path, llm):
    path = _with_generation_config(tiny_chat_model, tmp_path / "model")
    server = start_server(path, "inproc", tmp_path)
    try:
        with httpx.Client(base_url=server.url, timeout=60,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            texts = {http.post("/v1/completions", json={
                "prompt": "Once upon", "max_tokens": 6, "seed": seed, "ignore_eos": True,
            }).json()["choices"][0]["text"] for seed in (1, 2, 3)}
            _check_default_max_tokens(http)
    finally:
        assert server.stop() == 0
    greedy = llm.generate("Once upon", SamplingParams(temperature=0, max_tokens=6,
                                                      ignore_eos=True), use_tqdm=False)
    assert texts == {greedy[0].outputs[0].text}
    log = server.log_path.read_text()
    assert "Received request" not in log  # no --enable-log-requests: no request contents
    assert "Started server process" in log  # uvicorn's INFO lines, by default


def _check_default_max_tokens(http: httpx.Client) -> None:
    """The file's max_new_tokens (5) is max_tokens where a request leaves it unset (chat) or
    null (completions, whose unset max_tokens is 16, as in vLLM and OpenAI); what the request
    names wins; the context caps either."""
    def generated(path: str, **body) -> int:
        response = http.post(path, json={"ignore_eos": True, **body})
        assert response.status_code == 200, response.text
        return response.json()["usage"]["completion_tokens"]
    chat = {"messages": [{"role": "user", "content": "Hi"}]}
    assert generated("/v1/chat/completions", **chat) == 5
    assert generated("/v1/chat/completions", **chat, max_tokens=7) == 7
    assert generated("/v1/chat/completions", **chat, max_completion_tokens=3) == 3
    assert generated("/v1/completions", prompt="Once upon", max_tokens=None) == 5
    assert generated("/v1/completions", prompt="Once upon") == 16
    assert generated("/v1/completions", prompt=[1] * (MAX_MODEL_LEN - 2), max_tokens=None) == 2


BAD_VALUES = [("temperature", "hot", "must be a number, got 'hot'"),
              ("top_p", 7, r"must be in \(0, 1\], got 7"),
              ("max_new_tokens", 0, "must be at least 1, got 0")]


@pytest.mark.parametrize("key, value, reason", BAD_VALUES)
def test_a_bad_value_fails_at_start_up(tiny_chat_model, tmp_path, capsys, key, value, reason):
    """Once, naming the file and its key: `loom serve` exits with one line (not a 400 for
    every request later), and LLM(...) raises before loading the model."""
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(Path(tiny_chat_model) / "config.json", model)
    file = model / "generation_config.json"
    file.write_text(json.dumps({"temperature": 0.6, key: value}))
    what = f"{re.escape(str(file))}: {key}: {reason}"
    err = _main_error(capsys, "serve", str(model), "--device", "cpu")
    assert re.fullmatch(f"loom serve: error: model: {what}\n", err), err
    with pytest.raises(ValueError, match=f"^model: {what}$"):
        LLM(str(model), device="cpu")
    # Named by --generation-config, the file is that flag's.
    err = _main_error(capsys, "serve", str(tiny_chat_model), "--device", "cpu",
                      "--generation-config", str(model))
    assert re.fullmatch(f"loom serve: error: generation_config: {what}\n", err), err


OTHER = {"temperature": 0.3, "eos_token_id": [5, 7]}
"""The generation_config.json of a directory named by --generation-config."""


def _other_generation_config(tmp_path) -> str:
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "generation_config.json").write_text(json.dumps(OTHER))
    return str(tmp_path / "other")


def test_generation_config_auto_vllm_or_a_directory(tmp_path):
    """vLLM's --generation-config: the model's file, none, or another directory's; a
    directory without one is an error naming the field, as is a file that is not JSON."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "generation_config.json").write_text(json.dumps(RECOMMENDED))
    model = str(model)
    _other_generation_config(tmp_path)
    assert generation_defaults(model)["top_k"] == 7
    assert generation_defaults(model, "vllm") == {}
    assert generation_defaults(model, str(tmp_path / "other")) == {"temperature": 0.3}
    with pytest.raises(ValueError, match="^generation_config: .* is neither 'auto', 'vllm' "):
        generation_defaults(model, str(tmp_path))
    (tmp_path / "generation_config.json").write_text("{")
    with pytest.raises(ValueError, match="^generation_config: cannot read "):
        generation_defaults(model, str(tmp_path))


def test_offline_generation_config_directory_and_max_logprobs(tiny_llama_with_tokenizer,
                                                              tmp_path):
    """LLM(generation_config=DIR): that directory's defaults and EOS ids (vLLM reads both from
    it), not the model's; LLM(max_logprobs=...) caps what a request may ask for."""
    src, _ = tiny_llama_with_tokenizer
    path = _with_generation_config(src, tmp_path / "model")
    llm = LLM(path, dtype="float32", device="cpu", max_model_len=64,
              generation_config=_other_generation_config(tmp_path), max_logprobs=2)
    try:
        assert llm.get_default_sampling_params() == SamplingParams(temperature=0.3)
        ids = llm.get_tokenizer().encode("The quick brown fox")
        request = llm.processor.process("x", ids, SamplingParams())
        assert {5, 7} <= set(request.sampling_params.stop_token_ids)
        with pytest.raises(ValueError, match=r"^logprobs: 3 is more than the engine's "
                                             r"max_logprobs \(2\)"):
            llm.generate([ids], SamplingParams(max_tokens=1, logprobs=3), use_tqdm=False)
    finally:
        llm.shutdown()
