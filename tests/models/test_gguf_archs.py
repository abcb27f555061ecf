"""GGUF files of each architecture loom reads, written from tiny transformers models as
llama.cpp's converter writes them (`gguf_convert`): loom's greedy tokens and logprobs from
the GGUF equal transformers' from the model it was written from."""

from __future__ import annotations

import copy

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from loom.models.loader.gguf import load_gguf
from tests.conftest import TINY, hf_last_logprobs
from tests.e2e.test_correctness import _check_against_transformers, _llm, _prompts
from tests.models.gguf_convert import convert

LONG_PROMPTS = (5, 17, 200)
"""Llama 3's rope scaling slows only the low frequencies: it shows over longer prompts."""
FACTORY_KINDS = ["llama_tied", "qwen2", "qwen3", "qwen3_yarn", "mixtral", "phi3"]


def _tiny(config, path):
    import transformers as tf
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):  # Gemma's start at zero: random ones test the form
            param.data.normal_(0.0, 0.3)
    model.save_pretrained(path)
    return model.eval()


def _own_configs():
    import transformers as tf
    return {
        # MoE layers only: llama.cpp's Qwen MoE files have no dense layers.
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(**TINY, num_experts=8, num_experts_per_tok=2,
                                               moe_intermediate_size=32, norm_topk_prob=True),
        "qwen2_moe": lambda: tf.Qwen2MoeConfig(
            **TINY, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=64),
        # Llama 3.x's rope scaling parameters, which llama.cpp writes as rope_freqs; a base
        # large enough that the scaled frequencies matter within the test prompts.
        "llama3": lambda: tf.LlamaConfig(**TINY, rope_theta=2e6, rope_scaling={
            "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
        # What GGUF can say of Gemma 2: no query scale key (llama.cpp: head_dim below 27B),
        # alternate layers windowed; softcaps small enough to change the outputs.
        "gemma2": lambda: tf.Gemma2Config(**TINY, pad_token_id=0, sliding_window=16,
                                          query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
                                          final_logit_softcapping=3.0),
        # Gemma 3: every sixth layer global, the local layers' base 10000, the global ones'
        # scaled linearly.
        "gemma3": lambda: tf.Gemma3TextConfig(
            **dict(TINY, num_hidden_layers=6), pad_token_id=0, sliding_window=16,
            query_pre_attn_scalar=16, rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
    }


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory, tiny_model_factory):
    """kind -> (GGUF path, the transformers model it was written from)."""
    cache = {}

    def get(kind: str, qtype: Q | None = None):
        if (kind, qtype) not in cache:
            if kind in FACTORY_KINDS:
                hf_dir, hf = tiny_model_factory(kind)
            else:
                hf_dir = str(tmp_path_factory.mktemp(kind))
                hf = _tiny(_own_configs()[kind](), hf_dir)
            out = tmp_path_factory.mktemp("gguf") / f"{kind}.gguf"
            cache[kind, qtype] = convert(hf_dir, out, qtype), hf
        return cache[kind, qtype]
    return get


@pytest.mark.parametrize("kind", FACTORY_KINDS + ["qwen3_moe", "qwen2_moe", "llama3", "gemma2",
                                  "gemma3"])
def test_gguf_greedy_tokens_and_logprobs_match_transformers(kind, gguf_model):
    path, hf = gguf_model(kind)
    _check_against_transformers(_llm(str(path), max_logprobs=-1), hf, _prompts(
        lengths=LONG_PROMPTS if kind == "llama3" else (5, 17, 33, 3, 48)))


def test_quantized_stacked_experts(gguf_model):
    """Q8_0 experts, stacked [experts, rows, columns] and dequantized by the gguf package:
    loom equals transformers holding the same dequantized weights."""
    from gguf.quants import dequantize, quantize
    path, hf = gguf_model("qwen3_moe", Q.Q8_0)
    reference = copy.deepcopy(hf)
    with torch.no_grad():
        for param in reference.parameters():
            if param.dim() >= 2:
                array = param.detach().float().numpy()
                param.copy_(torch.from_numpy(dequantize(quantize(array, Q.Q8_0), Q.Q8_0)
                                             .reshape(array.shape)))
    assert not torch.equal(reference.lm_head.weight, hf.lm_head.weight)
    _check_against_transformers(_llm(str(path), max_logprobs=-1), reference, _prompts())


def test_llama3_rope_freqs_become_its_rope_scaling(gguf_model):
    """rope_freqs (llama.cpp's Llama 3 divisors) reads back as the parameters they came
    from; without them the reference moves past the comparison's tolerance."""
    import transformers as tf
    path, hf = gguf_model("llama3")
    config, _ = load_gguf(str(path))
    assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 32.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192}
    plain = tf.LlamaForCausalLM(tf.LlamaConfig(**TINY, rope_theta=2e6)).eval()
    plain.load_state_dict(hf.state_dict())
    prompt = _prompts(lengths=LONG_PROMPTS)[-1]
    assert not torch.allclose(hf_last_logprobs(plain, prompt), hf_last_logprobs(hf, prompt),
                              rtol=1e-4, atol=1e-4)


def test_gemma_norms_lose_the_converters_offset(gguf_model):
    path, hf = gguf_model("gemma2")
    _, weights = load_gguf(str(path))
    weights = dict(weights)
    for name, param in hf.state_dict().items():
        if name.endswith("norm.weight"):
            torch.testing.assert_close(weights[name], param, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind, fields", [
    ("qwen2_moe", {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 64, "mlp_only_layers": [],
                   "norm_topk_prob": False}),
    ("qwen3_moe", {"num_experts": 8, "moe_intermediate_size": 32, "mlp_only_layers": [],
                   "norm_topk_prob": True}),
    ("mixtral", {"architectures": ["MixtralForCausalLM"], "num_local_experts": 4}),
    ("gemma3", {"layer_types": ["sliding_attention"] * 5 + ["full_attention"],
                "rope_local_base_freq": 10000.0, "query_pre_attn_scalar": 16,
                "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    ("phi3", {"original_max_position_embeddings": 256, "max_position_embeddings": 512}),
])
def test_configs(gguf_model, kind, fields):
    config, _ = load_gguf(str(gguf_model(kind)[0]))
    assert {k: config[k] for k in fields} == fields
