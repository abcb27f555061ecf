"""Scoring with an embedding model, as vLLM scores bi-encoders: `LLM.score` equals the
cosine similarity of transformers' pooled hidden states; POST /score and /rerank (httpx: the
openai client has neither) equal it over HTTP, with vLLM's shapes, usage and errors."""

from __future__ import annotations

import httpx
import pytest
import torch
import torch.nn.functional as F

from tests.entrypoints.conftest import API_KEY, MAX_MODEL_LEN
from tests.worker.test_pooling import hf_pooled

AUTH = {"Authorization": f"Bearer {API_KEY}"}
QUERY = "Where do foxes sleep?"
DOCS = ["The quick brown fox jumps over the lazy dog.", "Foxes sleep in dens.",
        "Paris is the capital of France, on the Seine.", "Sleep"]

ON_ONE_SERVER = pytest.mark.parametrize("server", ["mp"], indirect=True)
"""The routes are the same code in every frontend mode: one server checks them."""


@pytest.fixture(scope="module")
def hf(tiny_chat_model):
    import transformers as tf
    return tf.AutoModelForCausalLM.from_pretrained(tiny_chat_model, dtype=torch.float32)


def hf_score(hf, ids_1: list[int], ids_2: list[int]) -> float:
    """The reference: cosine of the two texts' last-token final-norm hidden states."""
    return F.cosine_similarity(hf_pooled(hf, ids_1, "last"), hf_pooled(hf, ids_2, "last"),
                               dim=0).item()


@pytest.fixture(scope="module")
def offline(llm) -> list[float]:
    return [o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)]


def _tokens(llm, first: str, second: str) -> list[int]:
    """A pair's prompt_token_ids as vLLM reports them: first text, pad, second text."""
    tok = llm.tokenizer
    return tok.encode(first) + [tok.pad_token_id] + tok.encode(second)


# -- offline ----------------------------------------------------------------------------------

def test_llm_score_matches_transformers(llm, hf):
    outs = llm.score(QUERY, DOCS, use_tqdm=False)
    assert len({o.request_id for o in outs}) == len(DOCS)
    query_ids = llm.tokenizer.encode(QUERY)
    for doc, out in zip(DOCS, outs):
        assert out.prompt_token_ids == _tokens(llm, QUERY, doc) and out.finished
        assert out.outputs.score == pytest.approx(
            hf_score(hf, query_ids, llm.tokenizer.encode(doc)), abs=1e-4)
    # Pairwise lists, and one pair of strings, score each pair the same way.
    pairwise = llm.score([QUERY, DOCS[0]], DOCS[1:3], use_tqdm=False)
    assert [o.prompt_token_ids for o in pairwise] == [_tokens(llm, QUERY, DOCS[1]),
                                                      _tokens(llm, DOCS[0], DOCS[2])]
    assert pairwise[0].outputs.score == pytest.approx(outs[1].outputs.score, abs=1e-6)
    single = llm.score(DOCS[0], DOCS[2], use_tqdm=False)
    assert single[0].outputs.score == pytest.approx(pairwise[1].outputs.score, abs=1e-6)


def test_llm_score_truncates_as_embed(llm, hf):
    out = llm.score(QUERY, DOCS[0], truncate_prompt_tokens=3, use_tqdm=False)[0]
    query_ids, doc_ids = llm.tokenizer.encode(QUERY)[-3:], llm.tokenizer.encode(DOCS[0])[-3:]
    assert out.prompt_token_ids == query_ids + [llm.tokenizer.pad_token_id] + doc_ids
    assert out.outputs.score == pytest.approx(hf_score(hf, query_ids, doc_ids), abs=1e-4)


@pytest.mark.parametrize("data_1, data_2, field", [
    ([QUERY, QUERY], DOCS, "data_1"),
    ([], DOCS, "data_1"),
    (QUERY, [], "data_2"),
    (5, DOCS, "data_1"),
])
def test_llm_score_errors_name_the_argument(llm, data_1, data_2, field):
    with pytest.raises(ValueError, match=f"^{field}: "):
        llm.score(data_1, data_2, use_tqdm=False)


# -- server -----------------------------------------------------------------------------------

def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", headers=AUTH, json=body, timeout=60)


@ON_ONE_SERVER
def test_score_matches_offline(server, llm, offline):
    model = server.client().models.list().data[0].id
    resp = _post(server, "/score", {"model": model, "text_1": QUERY, "text_2": DOCS})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["id"].startswith("score-") and body["object"] == "list"
    assert body["model"] == model and isinstance(body["created"], int)
    assert [(d["index"], d["object"]) for d in body["data"]] == [(i, "score")
                                                                 for i in range(len(DOCS))]
    assert [d["score"] for d in body["data"]] == pytest.approx(offline, abs=1e-5)
    tokens = sum(len(_tokens(llm, QUERY, doc)) for doc in DOCS)
    assert body["usage"] == {"prompt_tokens": tokens, "completion_tokens": 0,
                             "total_tokens": tokens}
    # vLLM's other names for the two sides, and /v1/score, pair the same texts.
    for path, names in (("/v1/score", ("text_1", "text_2")), ("/score", ("queries", "documents")),
                        ("/score", ("data_1", "data_2")), ("/score", ("queries", "items"))):
        pairwise = _post(server, path, {names[0]: [QUERY, QUERY], names[1]: DOCS[:2]}).json()
        assert [d["score"] for d in pairwise["data"]] == pytest.approx(offline[:2], abs=1e-5)


@ON_ONE_SERVER
def test_rerank_sorts_cuts_and_counts(server, llm, offline):
    best_first = sorted(range(len(DOCS)), key=lambda i: -offline[i])
    tokens = sum(len(_tokens(llm, QUERY, doc)) for doc in DOCS)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        resp = _post(server, path, {"query": QUERY, "documents": DOCS, "top_n": 2})
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["id"].startswith("rerank-") and body["model"]
        assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
        assert [r["index"] for r in body["results"]] == best_first[:2]
        for r in body["results"]:
            assert r["document"] == {"text": DOCS[r["index"]]}
            assert r["relevance_score"] == pytest.approx(offline[r["index"]], abs=1e-5)
    every = _post(server, "/rerank", {"query": QUERY, "documents": DOCS,
                                      "return_documents": False}).json()["results"]
    assert [r["index"] for r in every] == best_first
    assert all(set(r) == {"index", "relevance_score"} for r in every)


@ON_ONE_SERVER
@pytest.mark.parametrize("path, body, param", [
    ("/score", {}, "text_1"),
    ("/score", {"text_1": QUERY}, "text_2"),
    ("/score", {"queries": QUERY}, "documents"),
    ("/score", {"text_1": QUERY, "documents": DOCS}, "documents"),
    ("/score", {"text_1": [QUERY, QUERY], "text_2": DOCS}, "text_1"),
    ("/score", {"text_1": [], "text_2": DOCS}, "text_1"),
    ("/score", {"text_1": QUERY, "text_2": ["a", ""]}, "text_2"),
    ("/score", {"text_1": 5, "text_2": DOCS}, "text_1"),
    ("/score", {"text_1": "x " * (MAX_MODEL_LEN + 10), "text_2": "y"}, "text_1"),
    ("/v1/score", {"text_1": QUERY, "text_2": DOCS, "truncate_prompt_tokens": -5},
     "truncate_prompt_tokens"),
    ("/rerank", {"documents": DOCS}, "query"),
    ("/rerank", {"query": QUERY}, "documents"),
    ("/rerank", {"query": QUERY, "documents": []}, "documents"),
    ("/rerank", {"query": QUERY, "documents": ["a", ""]}, "documents"),
    ("/rerank", {"query": "", "documents": DOCS}, "query"),
    ("/v2/rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, "top_n"),
], ids=["nothing", "one-side", "queries-alone", "mixed-names", "mismatched", "empty-list",
        "empty-text", "number", "too-long", "bad-truncation", "no-query", "no-documents",
        "empty-documents", "empty-document", "empty-query", "negative-top-n"])
def test_bad_input_is_a_400_naming_the_field(server, path, body, param):
    resp = _post(server, path, body)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["param"] == param and error["message"].startswith(param), error


@ON_ONE_SERVER
def test_unknown_model_is_a_404(server):
    for path, body in (("/score", {"text_1": QUERY, "text_2": DOCS}),
                       ("/rerank", {"query": QUERY, "documents": DOCS})):
        resp = _post(server, path, {**body, "model": "no-such-model"})
        assert resp.status_code == 404 and resp.json()["error"]["param"] == "model"
