"""loom's greedy tokens and logprobs against transformers on tiny random models (float32)."""

from __future__ import annotations

import random

import pytest
import torch

from loom import LLM, SamplingParams
from tests.conftest import hf_greedy, hf_last_logprobs

KINDS = ["llama", "llama_tied", "qwen2", "qwen3", "qwen3_yarn", "qwen3_moe", "mixtral",
         "qwen2_moe", "phi3", "phi3_partial", "mistral_window", "gemma", "gemma2", "gemma3",
         "granite", "granite_moe", "smollm3", "olmo2", "olmo3", "glm4", "seed_oss", "ernie4_5",
         "exaone4", "arcee"]
NEW_TOKENS = 12


def _prompts(seed: int = 0, lengths=(5, 17, 33, 3, 48)) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(n)] for n in lengths]


def _llm(path: str, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 256)
    return LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", **kwargs)


def _greedy(max_tokens=NEW_TOKENS, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def _check_against_transformers(llm: LLM, hf, prompts: list[list[int]]) -> None:
    outs = llm.generate(prompts, _greedy(logprobs=256), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, NEW_TOKENS)
        ref = hf_last_logprobs(hf, prompt)
        first = out.outputs[0].logprobs[0]
        ours = torch.tensor([first[t].logprob for t in range(256)])
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_and_logprobs_match_transformers(kind, tiny_model_factory):
    path, hf = tiny_model_factory(kind)
    # the whole vocabulary's logprobs; Phi-3 within its pretraining length (LongRoPE's
    # short factors)
    _check_against_transformers(_llm(path, max_logprobs=-1), hf, _prompts())


def test_dynamic_ntk_matches_transformers_at_the_scaled_context(tiny_model_factory):
    """Dynamic NTK: loom keeps one base, the one transformers grows to for a sequence of the
    whole scaled context (32 x 2 tokens). transformers, once it has seen such a sequence,
    keeps that base for shorter ones past 32 tokens: its greedy tokens and logprobs are
    the reference. Before that forward it runs these prompts on other bases, beyond the
    tolerance (the comparison can fail)."""
    path, hf = tiny_model_factory("llama_dynamic")
    prompts = _prompts(3, lengths=(40, 35))
    llm = _llm(path, max_model_len=None, max_logprobs=-1)
    assert llm.processor.max_model_len == 64
    fresh = hf_last_logprobs(hf, prompts[0])
    with torch.no_grad():
        hf(torch.zeros(1, 64, dtype=torch.long))  # transformers' base grows to 64 tokens'
    assert not torch.allclose(fresh, hf_last_logprobs(hf, prompts[0]), atol=1e-3)
    _check_against_transformers(llm, hf, prompts)


@pytest.mark.parametrize("scalar, llama_value", [
    ("embedding_multiplier", 1.0), ("residual_multiplier", 1.0),
    ("attention_multiplier", 16 ** -0.5), ("logits_scaling", 1.0)])
def test_each_granite_scalar_moves_the_reference_past_the_tolerance(scalar, llama_value):
    """The granite comparison above can fail for each scalar: transformers' own outputs
    with that one at Llama's value (what a loom that ignored it would compute) differ from
    the true config's by far more than its tolerance."""
    import transformers as tf

    from tests.conftest import GRANITE_SCALARS, TINY

    def last_logprobs(**scalars):
        torch.manual_seed(0)
        config = tf.GraniteConfig(**TINY, **{**GRANITE_SCALARS, **scalars},
                                  tie_word_embeddings=True)
        hf = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        return torch.stack([hf_last_logprobs(hf, p) for p in _prompts()])

    moved = (last_logprobs(**{scalar: llama_value}) - last_logprobs()).abs().max().item()
    assert moved > 100 * 1e-4


@pytest.mark.parametrize("flags", [[1, 1, 1, 1], [0, 0, 0, 0]],
                         ids=["every-layer-rotates", "no-layer-rotates"])
def test_smollm3_rope_flags_move_the_reference_past_the_tolerance(flags):
    """The smollm3 comparison above can fail on the per-layer flags: transformers' own
    outputs with every layer rotating (a loom that ignored no_rope_layers) or none (one that
    skipped rotary everywhere) differ from the true config's by far more than its tolerance."""
    import transformers as tf

    from tests.conftest import SMOLLM3

    def last_logprobs(**cfg):
        torch.manual_seed(0)
        hf = tf.AutoModelForCausalLM.from_config(tf.SmolLM3Config(**{**SMOLLM3, **cfg}),
                                                 dtype=torch.float32).eval()
        assert [layer.self_attn.use_rope for layer in hf.model.layers] == \
            (cfg or SMOLLM3)["no_rope_layers"]
        return torch.stack([hf_last_logprobs(hf, p) for p in _prompts()])

    moved = (last_logprobs(no_rope_layers=flags) - last_logprobs()).abs().max().item()
    assert moved > 100 * 1e-4


def test_phi3_long_rope_beyond_the_pretraining_length(tiny_model_factory):
    """max_model_len past original_max_position_embeddings (256): LongRoPE's long factors,
    which transformers takes too for sequences that long."""
    path, hf = tiny_model_factory("phi3")
    llm = _llm(path, max_model_len=512, max_logprobs=-1)
    _check_against_transformers(llm, hf, _prompts(seed=4, lengths=(270, 300)))


@pytest.mark.parametrize("kind", ["gemma3", "mistral_window", "smollm3_window"])
def test_windows_across_chunks_and_cached_prefixes(kind, tiny_model_factory):
    """Windows of 16 keys (SmolLM3's in its NoPE layers) no longer cap max_model_len (the
    model's 512). Prompts of up to four windows in chunks of 11 tokens (chunk and window
    boundaries apart), and a second prompt under a cached 48-token prefix: each query sees
    its window's keys where earlier chunks or the cache left them, as transformers does."""
    path, hf = tiny_model_factory(kind)
    llm = _llm(path, max_model_len=None, max_num_batched_tokens=11)
    assert llm.processor.max_model_len == 512
    base = _prompts(seed=5, lengths=(48,))[0]
    prompts = [base + [5, 6], _prompts(seed=6, lengths=(61,))[0]]
    outs = llm.generate(prompts, _greedy(max_tokens=20), use_tqdm=False)
    second = llm.generate([base + [7]], _greedy(max_tokens=20), use_tqdm=False)[0]
    assert second.num_cached_tokens == 48
    for prompt, out in zip(prompts + [base + [7]], outs + [second]):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 20)


@pytest.mark.parametrize("engine_kwargs", [
    dict(enable_prefix_caching=False),
    dict(max_num_batched_tokens=16),                       # chunked prefill
    # preemption: admitting as vLLM does (no headroom) runs out of blocks mid-decode (20
    # blocks, as vLLM's --num-gpu-blocks-override is used to test it)
    dict(num_gpu_blocks_override=20, max_model_len=160, kv_headroom_tokens=0),
], ids=["no-prefix-cache", "chunked-prefill", "preemption"])
@pytest.mark.parametrize("kind", ["llama", "qwen3_moe", "gemma2"])
def test_greedy_identity_under_scheduling_pressure(kind, engine_kwargs, tiny_model_factory,
                                                  monkeypatch):
    path, hf = tiny_model_factory(kind)
    from loom.core.scheduler import Scheduler
    preemptions, original = [], Scheduler._preempt
    monkeypatch.setattr(Scheduler, "_preempt",
                        lambda self, req: (preemptions.append(req.request_id), original(self, req)))
    prompts = _prompts(seed=1, lengths=(40, 25, 33, 47, 30, 41))
    # A shared prefix makes the prefix cache hit across requests.
    prompts += [prompts[0][:32] + [7, 8, 9], prompts[0][:32] + [10, 11]]
    llm = _llm(path, **engine_kwargs)
    outs = llm.generate(prompts, _greedy(max_tokens=20), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 20)
    kv = llm.engine.get_kv_info()
    assert kv["num_free_blocks"] == kv["num_blocks"]
    assert (kv["num_blocks"] == 20) == bool(preemptions) == (
        "num_gpu_blocks_override" in engine_kwargs)


@pytest.mark.parametrize("hash_algo", ["builtin", "sha256"])
def test_prefix_cache_hits_and_same_tokens(tiny_model_factory, hash_algo):
    path, hf = tiny_model_factory("llama")
    base = _prompts(seed=2, lengths=(64,))[0]
    llm = _llm(path, prefix_caching_hash_algo=hash_algo)
    first = llm.generate([base + [5]], _greedy(), use_tqdm=False)[0]
    second = llm.generate([base + [6]], _greedy(), use_tqdm=False)[0]
    assert second.num_cached_tokens == 64
    assert first.num_cached_tokens == 0
    assert second.outputs[0].token_ids == hf_greedy(hf, base + [6], NEW_TOKENS)
