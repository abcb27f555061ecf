"""POST /v1/embeddings through the official openai client against real servers: vectors
equal the offline LLM.embed, base64 decodes to the same floats, bad input gets a 400."""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest

from tests.entrypoints.conftest import API_KEY, MAX_MODEL_LEN, OUTPUT_FIELD_MODES

pytestmark = OUTPUT_FIELD_MODES

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEXTS = ["The quick brown fox", "jumps over the lazy dog, twice, then sleeps."]


@pytest.fixture(scope="module")
def offline_vectors(llm):
    return [o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)]


def _metric(server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{"))


def test_embeddings_match_offline(server, offline_vectors):
    client = server.client()
    finished = _metric(server, "loom:e2e_request_latency_seconds_count")
    queued = _metric(server, "loom:request_queue_time_seconds_count")
    resp = client.embeddings.create(model=client.models.list().data[0].id, input=TEXTS,
                                    encoding_format="float")
    # Each input is one pooling request, counted like a generation request.
    assert _metric(server, "loom:e2e_request_latency_seconds_count") == finished + len(TEXTS)
    assert _metric(server, "loom:request_queue_time_seconds_count") == queued + len(TEXTS)
    assert resp.object == "list" and [d.index for d in resp.data] == [0, 1]
    for data, expected in zip(resp.data, offline_vectors):
        assert data.object == "embedding"
        np.testing.assert_allclose(data.embedding, expected, atol=1e-5)
        assert abs(np.linalg.norm(data.embedding) - 1.0) < 1e-4
    assert resp.usage.prompt_tokens == resp.usage.total_tokens > len(TEXTS)


def test_embeddings_base64_and_token_ids(server, offline_vectors, llm):
    client = server.client()
    floats = client.embeddings.create(model=_model(client), input=TEXTS[0],
                                      encoding_format="float")
    raw = httpx.post(f"{server.url}/v1/embeddings", headers=AUTH, timeout=60,
                     json={"input": TEXTS[0], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.asarray(floats.data[0].embedding, dtype=np.float32))
    # The SDK asks for base64 by default and decodes it itself.
    default = client.embeddings.create(model=_model(client), input=TEXTS[0])
    np.testing.assert_allclose(default.data[0].embedding, offline_vectors[0], atol=1e-5)
    ids = [llm.tokenizer.encode(t) for t in TEXTS]
    by_ids = client.embeddings.create(model=_model(client), input=ids, encoding_format="float")
    for data, expected in zip(by_ids.data, offline_vectors):
        np.testing.assert_allclose(data.embedding, expected, atol=1e-5)
    single = client.embeddings.create(model=_model(client), input=ids[1], encoding_format="float")
    np.testing.assert_allclose(single.data[0].embedding, offline_vectors[1], atol=1e-5)


def _model(client) -> str:
    return client.models.list().data[0].id


@pytest.mark.parametrize("body", [
    {"input": []},
    {"input": 5},
    {"input": [[]]},
    {"input": [1, "a"]},
    {"input": [1, -3]},
    {"input": [1, 10**6]},
    {"input": [5] * (MAX_MODEL_LEN + 10)},
    {"input": "x", "dimensions": 8},
    {"input": "x", "encoding_format": "int8"},
], ids=["empty", "number", "empty-ids", "mixed", "negative-id", "outside-vocab", "too-long",
        "dimensions", "bad-format"])
def test_embeddings_bad_input(server, body):
    """Each is a 400 (and the server goes on serving)."""
    resp = httpx.post(f"{server.url}/v1/embeddings", headers=AUTH, json=body, timeout=30)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == 400
    with pytest.raises(openai.NotFoundError):
        server.client().embeddings.create(model="no-such-model", input="x")
    ok = httpx.post(f"{server.url}/v1/embeddings", headers=AUTH, json={"input": "x"}, timeout=30)
    assert ok.status_code == 200


def test_an_input_may_fill_the_whole_context(server):
    # Nothing is generated after an embedding's input: max_model_len tokens fit, one more
    # does not (and the error names the input, not a prompt's output room).
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
        full = http.post("/v1/embeddings", json={"input": [5] * MAX_MODEL_LEN})
        assert full.status_code == 200, full.text
        assert full.json()["usage"]["prompt_tokens"] == MAX_MODEL_LEN
        over = http.post("/v1/embeddings", json={"input": [5] * (MAX_MODEL_LEN + 1)})
    assert over.status_code == 400 and over.json()["error"]["param"] == "input", over.text


def test_truncate_prompt_tokens_embeds_the_last_tokens(server, llm):
    ids = llm.tokenizer.encode(TEXTS[1])
    resp = httpx.post(f"{server.url}/v1/embeddings", headers=AUTH, timeout=60,
                      json={"input": TEXTS[1], "truncate_prompt_tokens": 4}).json()
    assert resp["usage"]["prompt_tokens"] == 4
    expected = llm.embed([ids[-4:]], use_tqdm=False)[0].outputs.embedding
    np.testing.assert_allclose(resp["data"][0]["embedding"], expected, atol=1e-5)


def test_pooling_returns_the_embeddings(server, offline_vectors):
    """POST /pooling (vLLM's raw pooling API) on an embedding model: each input's vector as
    the offline LLM.embed makes it, in floats or base64; a classify task is a 404 naming
    what the model serves; bad input a 400."""
    def post(body):
        return httpx.post(f"{server.url}/pooling", headers=AUTH, timeout=60, json=body)
    resp = post({"input": TEXTS})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"].startswith("pool-") and body["object"] == "list"
    assert [(d["index"], d["object"]) for d in body["data"]] == [(0, "pooling"), (1, "pooling")]
    for data, expected in zip(body["data"], offline_vectors):
        np.testing.assert_allclose(data["data"], expected, atol=1e-5)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(TEXTS)
    raw = post({"input": TEXTS[1], "task": "embed", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["data"]), dtype="<f4")
    np.testing.assert_allclose(decoded, offline_vectors[1], atol=1e-5)
    wrong = post({"input": TEXTS[0], "task": "classify"})
    assert wrong.status_code == 404 and "embed" in wrong.json()["error"]["message"]
    bad = post({"input": []})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


def test_chat_messages_embed_as_the_template_renders_them(server, tiny_chat_model):
    """vLLM's chat form (`messages` instead of `input`) on /v1/embeddings and /pooling: the
    vector of the conversation as transformers' chat template renders it, without a
    generation prompt unless asked; both fields, or neither, is a 400."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny_chat_model)
    messages = [{"role": "system", "content": "Embed this."},
                {"role": "user", "content": TEXTS[1]}]

    def post(path, body):
        return httpx.post(f"{server.url}{path}", headers=AUTH, timeout=60, json=body)

    def vector(body, path="/v1/embeddings", key="embedding"):
        resp = post(path, body)
        assert resp.status_code == 200, resp.text
        return resp.json()["data"][0][key]
    for prompt in (False, True):
        ids = tok.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        want = vector({"input": ids})
        args = {"messages": messages} | ({"add_generation_prompt": True} if prompt else {})
        np.testing.assert_allclose(vector(args), want, atol=1e-6)
        np.testing.assert_allclose(vector(args, "/pooling", "data"), want, atol=1e-6)
    assert vector({"messages": messages}) != vector({"messages": messages,
                                                     "add_generation_prompt": True})
    both = post("/v1/embeddings", {"input": TEXTS[0], "messages": messages})
    assert both.status_code == 400 and "exactly one" in both.json()["error"]["message"]
    assert post("/pooling", {"model": "x"}).status_code in (400, 404)
    assert post("/v1/embeddings", {}).status_code == 400
