"""/v1/chat/completions against `LLM.chat`, and the small endpoints: models, version,
tokenize, detokenize, metrics, health."""

from __future__ import annotations

import httpx
import pytest

from loom import SamplingParams
from tests.entrypoints.conftest import API_KEY, MAX_MODEL_LEN

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three colours."}]


def _model(server) -> str:
    return server.client().models.list().data[0].id


def test_chat_equals_llm_chat_streamed_or_not(server, llm):
    client = server.client()
    kwargs = dict(model=_model(server), messages=MESSAGES, max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs)
    expected = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)[0]
    assert whole.choices[0].message.content == expected.outputs[0].text
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert whole.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_chat_n2_logprobs_and_stop(server, llm):
    client = server.client()
    response = client.chat.completions.create(
        model=_model(server), messages=MESSAGES, max_tokens=6, n=2, seed=7, temperature=0.8,
        logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    assert len(response.choices) == 2
    offline = llm.chat(MESSAGES, SamplingParams(n=2, seed=7, temperature=0.8, max_tokens=6,
                                                ignore_eos=True, logprobs=2), use_tqdm=False)[0]
    for choice, expected in zip(response.choices, offline.outputs):
        assert choice.message.content == expected.text
        content = choice.logprobs.content
        assert len(content) == 6
        for entry, token_id, position in zip(content, expected.token_ids, expected.logprobs):
            assert entry.logprob == pytest.approx(position[token_id].logprob, abs=1e-4)
            assert len(entry.top_logprobs) == 2
            assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    full = response.choices[0].message.content
    stop = full[-3:] if full[-3:].strip() else full[:3]
    if stop.strip():
        cut = client.chat.completions.create(model=_model(server), messages=MESSAGES, max_tokens=6,
                                             n=2, seed=7, temperature=0.8, stop=[stop],
                                             extra_body={"ignore_eos": True})
        assert cut.choices[0].message.content == full[:full.index(stop)]
        assert cut.choices[0].finish_reason == "stop"


def test_models_version_tokenize_detokenize(server, llm):
    client = server.client()
    models = client.models.list().data
    assert len(models) == 1 and models[0].max_model_len == MAX_MODEL_LEN
    base = server.url
    assert httpx.get(f"{base}/version").json()["version"]
    tokens = httpx.post(f"{base}/tokenize", json={"prompt": "Hello world"}).json()
    assert tokens["tokens"] == llm.get_tokenizer().encode("Hello world")
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == MAX_MODEL_LEN
    chat = httpx.post(f"{base}/tokenize", json={"messages": MESSAGES}).json()
    assert chat["tokens"] == llm.chat_prompt_ids(MESSAGES)
    text = httpx.post(f"{base}/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "Hello world"


def test_metrics_and_health(server):
    client = server.client()
    client.completions.create(model=_model(server), prompt="count", max_tokens=4,
                              extra_body={"ignore_eos": True})
    assert httpx.get(f"{server.url}/health").status_code == 200
    text = httpx.get(f"{server.url}/metrics").text
    for name in ["loom:num_requests_running", "loom:num_requests_waiting",
                 "loom:kv_cache_usage_perc", "loom:prefix_cache_queries_total",
                 "loom:prefix_cache_hits_total", "loom:prompt_tokens_total",
                 "loom:generation_tokens_total", "loom:time_to_first_token_seconds_bucket",
                 "loom:inter_token_latency_seconds_bucket", "loom:e2e_request_latency_seconds_count",
                 "loom:request_queue_time_seconds_count",
                 "loom:request_prefill_time_seconds_count"]:
        assert name in text, name
    assert _sample(text, "loom:request_prefill_time_seconds_count") >= 1
    generated = _sample(text, "loom:generation_tokens_total")
    assert generated >= 4


def _sample(text: str, name: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert values, name
    return sum(values)


def test_api_key_is_required_on_v1_only(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.get(f"{server.url}/v1/models", headers=headers)
        assert r.status_code == 401
        assert set(r.json()["error"]) >= {"message", "type", "param", "code"}
    ok = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_api_server_process_never_imports_torch(server):
    info = server.introspect()
    assert info["torch_loaded"] == (server.mode == "inproc"), info
