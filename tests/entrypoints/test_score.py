"""Scoring with an embedding model, as vLLM scores bi-encoders: `LLM.score` equals the
cosine similarity of transformers' pooled hidden states."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.worker.test_pooling import hf_pooled

QUERY = "Where do foxes sleep?"
DOCS = ["The quick brown fox jumps over the lazy dog.", "Foxes sleep in dens.",
        "Paris is the capital of France, on the Seine.", "Sleep"]


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
