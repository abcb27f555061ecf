"""A classification model served as vLLM serves one: POST /classify in vLLM's shape, /score
and /rerank as a cross-encoder (each pair run as one sequence: the sigmoid of transformers'
logit on the tokenizer's pair encoding), and what it does not serve (generation, embeddings)
refused with vLLM's 404; a generative model refuses /classify alike. httpx: the openai
client has none of these routes."""

from __future__ import annotations

import httpx
import pytest
import torch

from tests.entrypoints.conftest import API_KEY, start_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
QUERY = "Where do foxes sleep?"
DOCS = ["Foxes sleep in dens.", "Paris is the capital of France, on the Seine.", "Sleep"]


@pytest.fixture(scope="module")
def cls_server(tiny_cross_encoder, tmp_path_factory):
    s = start_server(tiny_cross_encoder[0], "inproc", tmp_path_factory.mktemp("cls-logs"))
    yield s
    assert s.stop() == 0, s.log_tail()


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", headers=AUTH, json=body, timeout=60)


def _hf_scores(tiny_cross_encoder, pairs) -> tuple[list[float], int]:
    """transformers' sigmoid scores of the pairs, and their tokens in all."""
    _, hf, tok = tiny_cross_encoder
    ids = [tok(a, text_pair=b)["input_ids"] for a, b in pairs]
    with torch.no_grad():
        logits = [hf(torch.tensor([i])).logits[0, 0] for i in ids]
    return [torch.sigmoid(x).item() for x in logits], sum(map(len, ids))


def test_classify(cls_server, tiny_cross_encoder):
    _, hf, tok = tiny_cross_encoder
    ids = tok(QUERY)["input_ids"]
    with torch.no_grad():
        prob = torch.sigmoid(hf(torch.tensor([ids])).logits[0, 0]).item()
    resp = _post(cls_server, "/classify", {"input": [QUERY, "Paris"]})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"].startswith("classify-") and body["object"] == "list" and body["model"]
    assert [(d["index"], d["label"], d["num_classes"]) for d in body["data"]] == \
        [(0, "LABEL_0", 1), (1, "LABEL_0", 1)]
    assert body["data"][0]["probs"] == pytest.approx([prob], abs=1e-5)
    tokens = len(ids) + len(tok("Paris")["input_ids"])
    assert body["usage"] == {"prompt_tokens": tokens, "completion_tokens": 0,
                             "total_tokens": tokens, "prompt_tokens_details": None}
    as_ids = _post(cls_server, "/classify", {"input": ids}).json()
    assert as_ids["data"][0]["probs"] == pytest.approx([prob], abs=1e-5)
    raw = _post(cls_server, "/classify", {"input": QUERY, "use_activation": False}).json()
    assert torch.sigmoid(torch.tensor(raw["data"][0]["probs"][0])).item() == \
        pytest.approx(prob, abs=1e-5)
    bad = _post(cls_server, "/classify", {"input": []})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    # /pooling: a classifier's pooled output is its class probabilities
    pooled = _post(cls_server, "/pooling", {"input": [QUERY, "Paris"]}).json()
    assert pooled["id"].startswith("pool-")
    assert pooled["data"][0] == {"object": "pooling", "index": 0,
                                 "data": pytest.approx([prob], abs=1e-5)}
    assert pooled["usage"]["prompt_tokens"] == tokens
    raw_pooled = _post(cls_server, "/pooling", {"input": QUERY, "use_activation": False})
    assert raw_pooled.json()["data"][0]["data"] == raw["data"][0]["probs"]
    assert _post(cls_server, "/pooling", {"input": QUERY, "task": "embed"}).status_code == 404


def test_score_and_rerank_cross_encode(cls_server, tiny_cross_encoder):
    expected, tokens = _hf_scores(tiny_cross_encoder, [(QUERY, d) for d in DOCS])
    resp = _post(cls_server, "/score", {"text_1": QUERY, "text_2": DOCS})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)
    assert body["usage"]["prompt_tokens"] == tokens
    pairwise = _post(cls_server, "/v1/score", {"queries": [QUERY, DOCS[0]],
                                                "documents": DOCS[1:]}).json()
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(
        _hf_scores(tiny_cross_encoder, [(QUERY, DOCS[1]), (DOCS[0], DOCS[2])])[0], abs=1e-5)
    rerank = _post(cls_server, "/rerank", {"query": QUERY, "documents": DOCS, "top_n": 2}).json()
    best = sorted(range(len(DOCS)), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in rerank["results"]] == best
    assert [r["relevance_score"] for r in rerank["results"]] == \
        pytest.approx([expected[i] for i in best], abs=1e-5)
    assert rerank["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    long = _post(cls_server, "/score", {"text_1": QUERY, "text_2": ["a", "fox " * 5000]})
    assert long.status_code == 400 and long.json()["error"]["param"] == "text_2", long.text
    assert long.json()["error"]["message"].startswith("text_2[1]: ")


@pytest.mark.parametrize("path, body, api", [
    ("/v1/embeddings", {"input": QUERY}, "Embeddings API"),
    ("/v1/completions", {"prompt": QUERY, "max_tokens": 2}, "Completions API"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": QUERY}]},
     "Chat Completions API"),
    ("/v1/responses", {"input": QUERY}, "Responses API"),
])
def test_what_a_classifier_does_not_serve_is_a_404(cls_server, path, body, api):
    resp = _post(cls_server, path, body)
    assert resp.status_code == 404, resp.text
    error = resp.json()["error"]
    assert error["type"] == "NotFoundError" and error["param"] == "model"
    assert error["message"].startswith(f"The model does not support {api}: "
                                       "LlamaForSequenceClassification serves classification")


@pytest.mark.parametrize("server", ["mp"], indirect=True)
def test_generative_model_has_no_classify(server):
    resp = _post(server, "/classify", {"input": QUERY})
    assert resp.status_code == 404 and resp.json()["error"]["message"].startswith(
        "The model does not support Classification API: LlamaForCausalLM serves generation, "
        "embeddings"), resp.text
