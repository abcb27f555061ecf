"""Pooling requests: vectors equal transformers' final hidden states, under chunked prefill,
the prefix cache, and batched with generation requests whose tokens stay unchanged."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

import loom
from loom import LLM, SamplingParams
from loom.pooling_params import PoolingParams
from tests.conftest import hf_greedy

PROMPTS = [[random.Random(i).randrange(3, 256) for _ in range(n)]
           for i, n in enumerate((7, 30, 19))]


def hf_pooled(model, ids: list[int], kind: str, normalize: bool = True) -> torch.Tensor:
    with torch.no_grad():
        hidden = model.model(torch.tensor([ids])).last_hidden_state[0].float()
    vec = {"last": hidden[-1], "mean": hidden.mean(0), "cls": hidden[0]}[kind]
    return F.normalize(vec, dim=-1) if normalize else vec


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny(request, tiny_model_factory):
    path, hf = tiny_model_factory(request.param)
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              max_num_batched_tokens=12, block_size=4)
    yield llm, hf
    llm.shutdown()


@pytest.mark.parametrize("kind", ["last", "mean", "cls"])
def test_embed_matches_transformers_chunked(tiny, kind):
    llm, hf = tiny
    for normalize in (True, False):
        outs = llm.embed(PROMPTS, PoolingParams(pooling_type=kind, normalize=normalize),
                         use_tqdm=False)
        for prompt, out in zip(PROMPTS, outs):
            assert out.prompt_token_ids == prompt and out.finished
            expected = hf_pooled(hf, prompt, kind, normalize)
            torch.testing.assert_close(torch.tensor(out.outputs.embedding), expected,
                                       atol=1e-4, rtol=1e-4)


def test_embed_twice_with_prefix_cache(tiny):
    """The second run hits the prefix cache for last pooling; mean must not use it."""
    llm, hf = tiny
    for kind in ("last", "mean", "last", "mean"):
        out = llm.embed(PROMPTS[1], PoolingParams(pooling_type=kind), use_tqdm=False)[0]
        torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                                   hf_pooled(hf, PROMPTS[1], kind), atol=1e-4, rtol=1e-4)
    assert llm.engine.scheduler.kv_cache_manager.num_free_blocks == llm.engine.num_blocks


def test_pooling_batched_with_generation(tiny):
    llm, hf = tiny
    engine, processor = llm.engine, llm.processor
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(processor.process(f"gen{i}", prompt, params))
        engine.add_request(processor.process_pooling(f"emb{i}", prompt[::-1],
                                                     PoolingParams(pooling_type="mean")))
    tokens: dict[str, list[int]] = {}
    pooled: dict[str, list[float]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step().outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.pooled is not None:
                assert out.finished and not out.new_token_ids and str(out.finish_reason) == "stop"
                pooled[out.request_id] = out.pooled
    for i, prompt in enumerate(PROMPTS):
        assert tokens[f"gen{i}"] == hf_greedy(hf, prompt, 6)
        torch.testing.assert_close(torch.tensor(pooled[f"emb{i}"]),
                                   hf_pooled(hf, prompt[::-1], "mean"), atol=1e-4, rtol=1e-4)


def test_pooling_params_validated():
    with pytest.raises(ValueError, match="pooling_type"):
        PoolingParams(pooling_type="max")


def test_encode_is_embed_as_a_tensor(tiny):
    """vLLM's LLM.encode: a generative model's own task is embed; the data is transformers'
    pooled state as a float32 tensor. Token-wise tasks are refused as not built."""
    llm, hf = tiny
    outs = llm.encode(PROMPTS, PoolingParams(pooling_type="mean"), use_tqdm=False)
    named = llm.encode(PROMPTS[0], pooling_task="embed", use_tqdm=False)[0]
    for prompt, out in zip(PROMPTS, outs):
        assert out.prompt_token_ids == prompt and out.finished
        assert isinstance(out, loom.PoolingRequestOutput)  # exported as vLLM exports it
        assert out.outputs.data.dtype == torch.float32
        torch.testing.assert_close(out.outputs.data, hf_pooled(hf, prompt, "mean"),
                                   atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(named.outputs.data, hf_pooled(hf, PROMPTS[0], "last"),
                               atol=1e-4, rtol=1e-4)
    with pytest.raises(NotImplementedError, match="pooling_task: 'token_embed'"):
        llm.encode(PROMPTS[0], pooling_task="token_embed")
    with pytest.raises(ValueError, match="pooling_task: must be embed or classify"):
        llm.encode(PROMPTS[0], pooling_task="reward")
    with pytest.raises(ValueError, match=r"does not support LLM.encode\(\)"):
        llm.encode(PROMPTS[0], pooling_task="classify")
