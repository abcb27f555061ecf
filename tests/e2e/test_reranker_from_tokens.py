"""vLLM's conversion of a causal LM reranker (Qwen3-Reranker, bge-reranker-v2-gemma,
mxbai-rerank-v2) into a classifier as it loads: classifier_from_token's LM-head rows make
the score head. loom's logits equal transformers' causal LM's logits of those tokens at
the prompt's last position (their difference, for from_2_way_softmax)."""

from __future__ import annotations

import random

import pytest
import torch

from loom import LLM
from loom.pooling_params import PoolingParams

OVERRIDES = {"architectures": ["LlamaForSequenceClassification"]}


def _logits(hf, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([prompt])).logits[0, -1]


@pytest.mark.parametrize("conversion, expected", [
    ({"classifier_from_token": ["no", "yes"], "method": "from_2_way_softmax"},
     lambda logits, ids: [logits[ids["yes"]] - logits[ids["no"]]]),
    ({"is_original_qwen3_reranker": True},
     lambda logits, ids: [logits[ids["yes"]] - logits[ids["no"]]]),
    ({"classifier_from_token": ["Yes", "no"], "method": "no_post_processing"},
     lambda logits, ids: [logits[ids["Yes"]], logits[ids["no"]]]),
], ids=["2-way", "qwen3-reranker", "no-post-processing"])
def test_reranker_from_tokens_equals_the_causal_lm(tiny_llama_with_tokenizer, conversion,
                                                   expected):
    from loom.frontend.tokenizer import load_tokenizer
    path, hf = tiny_llama_with_tokenizer
    tokenizer = load_tokenizer(path)
    ids = {t: tokenizer.token_to_id(t) for t in ("no", "yes", "Yes")}
    llm = LLM(path, dtype="float32", device="cpu", max_model_len=128,
              hf_overrides={**OVERRIDES, **conversion})
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 100000) for _ in range(n)] for n in (4, 21)]
    outs = llm.classify([{"prompt_token_ids": p} for p in prompts],
                        pooling_params=PoolingParams(task="classify", use_activation=False),
                        use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        want = torch.stack(expected(_logits(hf, prompt), ids))
        torch.testing.assert_close(torch.tensor(out.outputs.probs), want, rtol=1e-4,
                                   atol=1e-5)
    llm.shutdown()


@pytest.mark.parametrize("conversion, message", [
    ({"classifier_from_token": ["no", "yes"]}, "method: how classifier_from_token"),
    ({"classifier_from_token": ["no"], "method": "from_2_way_softmax"},
     "from_2_way_softmax takes two tokens"),
    ({"classifier_from_token": ["no", "zzzzqqq"], "method": "from_2_way_softmax"},
     r"classifier_from_token: \['zzzzqqq'\] not in the tokenizer"),
])
def test_bad_conversions_are_named(tiny_llama_with_tokenizer, conversion, message):
    path, _ = tiny_llama_with_tokenizer
    with pytest.raises(ValueError, match=message):
        LLM(path, dtype="float32", device="cpu", max_model_len=128,
            hf_overrides={**OVERRIDES, **conversion})
