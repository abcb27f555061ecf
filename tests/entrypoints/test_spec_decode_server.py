"""`loom serve --speculative-config`: greedy answers through the official openai client equal
the offline engine's without drafts, and /metrics counts the drafts as vLLM names them
(n-gram lookup, and a draft model: the served model drafting for itself, every draft kept)."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from loom import SamplingParams
from tests.entrypoints.conftest import start_server

SPEC = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, ' \
       '"prompt_lookup_min": 1}'
PROMPTS = ["one two three one two three one two three one two", "a b a b a b a b a b a b"]


def _counter(metrics: str, name: str) -> float:
    found = re.search(rf"^loom:{name}_total{{[^}}]*}} (\S+)$", metrics, re.M)
    assert found, f"loom:{name}_total missing"
    return float(found.group(1))


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_served_with_drafts(method, tiny_chat_model, llm, tmp_path):
    spec = SPEC if method == "ngram" else json.dumps(
        {"model": tiny_chat_model, "num_speculative_tokens": 3})
    server = start_server(tiny_chat_model, "mp", tmp_path,
                          extra_args=("--speculative-config", spec))
    try:
        client = server.client()
        texts = [client.completions.create(model=client.models.list().data[0].id, prompt=p,
                                           max_tokens=24, temperature=0.0).choices[0].text
                 for p in PROMPTS]
        stream = client.completions.create(model=client.models.list().data[0].id,
                                           prompt=PROMPTS[0], max_tokens=24, temperature=0.0,
                                           stream=True)
        streamed = "".join(chunk.choices[0].text for chunk in stream)
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    finally:
        assert server.stop() == 0
    expected = [o.outputs[0].text for o in llm.generate(
        PROMPTS, SamplingParams(temperature=0.0, max_tokens=24), use_tqdm=False)]
    assert texts == expected and streamed == expected[0]
    drafts = _counter(metrics, "spec_decode_num_drafts")
    drafted = _counter(metrics, "spec_decode_num_draft_tokens")
    accepted = _counter(metrics, "spec_decode_num_accepted_tokens")
    assert drafts > 0 and drafted >= drafts and 0 <= accepted <= drafted, metrics
    if method == "draft_model":
        assert accepted == drafted
    assert "loom:spec_decode_num_accepted_tokens_per_pos_total" in metrics
