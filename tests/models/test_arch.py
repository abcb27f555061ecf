"""What `ModelArch` reads from the configs of Mixtral, Qwen2-MoE, Mistral, Phi-3, Gemma,
Granite and Granite MoE (which layers attend within a sliding window, Gemma 3's two rotary
bases, Granite's four scalars), and what loom refuses (multimodal configs); no engine runs
here."""

from __future__ import annotations

import math

import pytest
import torch

from loom.models.arch import ModelArch, resolve_max_model_len

BASE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 4096}


def _arch(architecture: str, **cfg) -> ModelArch:
    return ModelArch.from_hf_config({**BASE, "architectures": [architecture], **cfg})


def test_mixtral_experts_are_intermediate_size_wide_and_renormalised():
    arch = _arch("MixtralForCausalLM", num_local_experts=8, num_experts_per_tok=2)
    assert (arch.num_experts, arch.moe_intermediate_size, arch.norm_topk_prob) == (8, 128, True)
    assert all(arch.is_moe_layer(i) for i in range(4))
    attn = 64 * 16 * (2 * 4 + 2 * 2)
    assert arch.num_params == 4 * (attn + 3 * 64 * 128 * 2)


QWEN2_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                 mlp_only_layers=[0], decoder_sparse_step=1)


def test_qwen2_moe_shared_expert_and_its_defaults():
    from loom.bench.floors import param_counts
    arch = _arch("Qwen2MoeForCausalLM", **QWEN2_MOE, shared_expert_intermediate_size=96)
    assert not arch.norm_topk_prob  # transformers' default for Qwen2-MoE
    assert [arch.is_moe_layer(i) for i in range(4)] == [False, True, True, True]
    attn = 64 * 16 * (2 * 4 + 2 * 2)
    moe = 3 * 64 * (32 * 2 + 96)  # the shared expert runs for every token
    assert arch.num_params == 4 * attn + 3 * 64 * 128 + 3 * moe
    with pytest.raises(ValueError, match=r"shared expert intermediate size \(96\)"):
        arch.check_tensor_parallel(64)
    # Benchmarks' weight reads: the shared experts and their gates are dense weights.
    unshared = param_counts(_arch("Qwen2MoeForCausalLM", **QWEN2_MOE))
    assert param_counts(arch).experts == unshared.experts == 3 * 8 * 3 * 64 * 32
    assert param_counts(arch).dense - unshared.dense == 3 * (3 * 64 * 96 + 64)


@pytest.mark.parametrize("cfg, window", [
    ({"sliding_window": 1024}, 1024),                          # Mistral 7B v0.1
    ({"sliding_window": None}, None),                          # Mixtral, Mistral v0.2
    ({"sliding_window": 1024, "use_sliding_window": False}, None),  # Qwen2: carried, unused
    ({"sliding_window": 1024, "use_sliding_window": True}, 1024),
    ({"sliding_window": 8192}, 8192),                          # wider than the context
])
def test_sliding_window(cfg, window):
    arch = _arch("MistralForCausalLM", **cfg)
    assert arch.sliding_window == window
    assert [arch.window(i) for i in range(4)] == [window] * 4  # every layer, or none
    assert arch.context_len == 4096  # honoured, not a cap
    assert resolve_max_model_len(None, arch.context_len) == 4096


@pytest.mark.parametrize("architecture, cfg, sliding", [
    ("Gemma2ForCausalLM", {}, [0, 2]),                              # every other layer
    ("Gemma3ForCausalLM", {}, [0, 1, 2, 3]),                        # 5 local to 1 global
    ("Gemma3ForCausalLM", {"sliding_window_pattern": 2}, [0, 2]),
    ("Gemma3ForCausalLM", {"layer_types": ["full_attention", "sliding_attention"] * 2},
     [1, 3]),                                                       # transformers 5's form
    ("Qwen2ForCausalLM", {"use_sliding_window": True, "max_window_layers": 2}, [2, 3]),
    ("Qwen2MoeForCausalLM", {"use_sliding_window": True, "max_window_layers": 3}, [0, 2]),
    ("Phi3ForCausalLM", {}, [0, 1, 2, 3]),
    ("Olmo3ForCausalLM", {}, [0, 1, 2]),                            # 3 local to 1 global
    ("Exaone4ForCausalLM", {}, [0, 1, 2]),
    ("Exaone4ForCausalLM", {"sliding_window_pattern": "LG"}, [0, 2]),  # its string form
])
def test_which_layers_slide(architecture, cfg, sliding):
    arch = _arch(architecture, sliding_window=512, **cfg)
    assert [i for i in range(4) if arch.window(i) == 512] == sliding
    assert all(arch.window(i) is None for i in range(4) if i not in sliding)


def test_layer_types_of_other_kinds_are_refused():
    with pytest.raises(ValueError, match=r"layer_types: .*\['chunked_attention'\]"):
        _arch("Gemma3ForCausalLM", sliding_window=512,
              layer_types=["chunked_attention", "full_attention"] * 2)


@pytest.mark.parametrize("cfg", [
    {"rope_theta": 1e6, "rope_local_base_freq": 1e4,
     "rope_scaling": {"rope_type": "linear", "factor": 8.0}},        # gemma-3-4b's config
    {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}},
], ids=["rope_local_base_freq", "rope_parameters"])
def test_gemma3_rotary_bases(cfg):
    """Global layers at rope_theta with rope_scaling, local ones at their own base."""
    arch = _arch("Gemma3ForCausalLM", sliding_window=512, query_pre_attn_scalar=256, **cfg)
    assert (arch.rope_theta, arch.local_rope_theta) == (1e6, 1e4)
    assert arch.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert arch.attn_scale == 256 ** -0.5


def test_multimodal_and_bidirectional_configs_are_refused():
    text = {**BASE, "model_type": "gemma3_text"}
    with pytest.raises(ValueError, match="Gemma3ForConditionalGeneration: a multimodal model"):
        ModelArch.from_hf_config({"architectures": ["Gemma3ForConditionalGeneration"],
                                  "text_config": text, "vision_config": {}})
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        _arch("Gemma3ForCausalLM", use_bidirectional_attention=True)
    from loom.models.gemma import Gemma2ForCausalLM
    with pytest.raises(ValueError, match="hidden_activation 'gelu' is not supported"):
        Gemma2ForCausalLM(_arch("Gemma2ForCausalLM", hidden_activation="gelu"))


# Phi-3-mini-128k's config.json as written in 2024: "su", the original length beside the
# context; and as transformers 5 saves it: rope_parameters holds everything.
SU = {"rope_scaling": {"type": "su", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8},
      "original_max_position_embeddings": 256, "max_position_embeddings": 4096}
ROPE_PARAMETERS = {"rope_parameters": {
    "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 1.0,
    "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
    "original_max_position_embeddings": 256}, "max_position_embeddings": 4096}


@pytest.mark.parametrize("cfg", [SU, ROPE_PARAMETERS], ids=["su", "rope_parameters"])
def test_long_rope_from_either_config_form(cfg):
    rope = _arch("Phi3ForCausalLM", **cfg).long_rope
    assert rope.original_max_position_embeddings == 256
    assert rope.short_factor == (1.0,) * 8 and rope.long_factor == (4.0,) * 8
    assert rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(16) / math.log(256)))


def test_long_rope_table_equals_transformers():
    """Short factors when max_model_len fits in the pretraining length, long ones beyond,
    cos and sin scaled, as transformers' Phi-3 rotary computes them for such sequences."""
    import transformers as tf

    from loom.models.llama import make_rotary
    short, long = [1.0 + i / 8 for i in range(8)], [2.0 + i for i in range(8)]
    hf_config = tf.Phi3Config(hidden_size=64, num_attention_heads=4, vocab_size=256,
                              pad_token_id=0, max_position_embeddings=4096,
                              original_max_position_embeddings=256, rope_scaling={
                                  "rope_type": "longrope", "short_factor": short,
                                  "long_factor": long})
    arch = ModelArch.from_hf_config(hf_config.to_dict() | {"architectures": ["Phi3ForCausalLM"]})
    hf = tf.models.phi3.modeling_phi3.Phi3RotaryEmbedding(hf_config)
    for max_model_len, positions in ((256, torch.arange(256)), (4096, torch.arange(1000))):
        cos, sin = hf(torch.zeros(1, dtype=torch.float32), positions[None])
        ours = make_rotary(arch, max_model_len).cos_sin_cache[positions]
        torch.testing.assert_close(ours, torch.cat([cos[0, :, :8], sin[0, :, :8]], dim=-1))


def test_partial_rotary_embedding_rotates_that_share_of_each_head():
    """Phi-4-mini's 0.75 of 16 features: a 12-wide table (its outputs against transformers
    in tests/e2e/test_correctness.py); a share that is not a whole number of pairs is
    refused by name."""
    from loom.models.llama import make_rotary
    rotary = make_rotary(_arch("Phi3ForCausalLM", partial_rotary_factor=0.75), 4096)
    assert rotary.rotary_dim == 12 and rotary.cos_sin_cache.shape == (4096, 12)
    with pytest.raises(ValueError, match="rotary_dim 11 must be even"):
        make_rotary(_arch("Phi3ForCausalLM", partial_rotary_factor=0.6875), 4096)


GRANITE = ("embedding_multiplier", "residual_multiplier", "attention_multiplier",
           "logits_scaling")


def test_granite_scalars_and_their_defaults():
    """Granite's four scalars as transformers' GraniteConfig saves them, its defaults (1.0,
    the softmax scale included) where config.json leaves them out, and Llama's values."""
    import transformers as tf

    from loom.models.granite import GraniteForCausalLM
    from loom.models.registry import model_class
    values = dict(embedding_multiplier=12, residual_multiplier=0.22,
                  attention_multiplier=0.015625, logits_scaling=8)
    saved = tf.GraniteConfig(**BASE, **values).to_dict()
    arch = ModelArch.from_hf_config(saved | {"architectures": ["GraniteForCausalLM"]})
    assert [getattr(arch, name) for name in GRANITE] == [12.0, 0.22, 0.015625, 8.0]
    assert arch.attn_scale == 0.015625
    assert model_class(arch) is GraniteForCausalLM
    defaults = tf.GraniteConfig()
    granite = _arch("GraniteForCausalLM")
    assert [getattr(granite, name) for name in GRANITE] == \
        [getattr(defaults, name) for name in GRANITE] == [1.0] * 4
    assert granite.attn_scale == 1.0
    llama = _arch("LlamaForCausalLM")
    assert [getattr(llama, name) for name in GRANITE] == [1.0, 1.0, None, 1.0]
    assert llama.attn_scale == 16 ** -0.5


def test_granite_moe_experts_scalars_and_stacked_expert_names():
    """GraniteMoe's config as transformers saves it: num_local_experts experts, each
    intermediate_size wide, top-k renormalised (a softmax over the top-k logits), Granite's
    scalars; its stacked checkpoint experts become per-expert gate / up / down tensors, and
    quantized ones are refused by name."""
    import transformers as tf

    from loom.models.granite import GraniteMoeForCausalLM, _per_expert
    from loom.models.registry import model_class
    saved = tf.GraniteMoeConfig(**BASE, num_local_experts=8, num_experts_per_tok=2,
                                embedding_multiplier=12, logits_scaling=8).to_dict()
    arch = ModelArch.from_hf_config(saved | {"architectures": ["GraniteMoeForCausalLM"]})
    assert (arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size,
            arch.norm_topk_prob) == (8, 2, 128, True)
    assert all(arch.is_moe_layer(i) for i in range(4))
    assert [getattr(arch, name) for name in GRANITE] == [12.0, 1.0, 1.0, 8.0]
    assert model_class(arch) is GraniteMoeForCausalLM
    moe = "model.layers.0.block_sparse_moe."
    w13, w2 = torch.randn(2, 6, 4), torch.randn(2, 4, 3)
    out = dict(_per_expert([(moe + "input_linear.weight", w13),
                            (moe + "output_linear.weight", w2),
                            (moe + "router.layer.weight", torch.ones(2, 4))]))
    experts = moe + "experts."
    assert out[experts + "1.gate_proj.weight"].equal(w13[1, :3])
    assert out[experts + "1.up_proj.weight"].equal(w13[1, 3:])
    assert out[experts + "0.down_proj.weight"].equal(w2[0])
    assert moe + "router.weight" in out and len(out) == 7
    for name, tensor in [("input_linear.weight", w13.to(torch.float8_e4m3fn)),
                         ("input_linear.weight_scale", torch.ones(2, 6, 1)),
                         ("output_linear.qweight", torch.zeros(2, 1, 3, dtype=torch.int32))]:
        with pytest.raises(ValueError, match=f"'{moe}{name}'.*unquantized only"):
            list(_per_expert([(moe + name, tensor)]))


def _saved(hf_config) -> dict:
    """The config.json transformers saves for hf_config, less its architectures (None)."""
    return {k: v for k, v in hf_config.to_dict().items() if k != "architectures"}


@pytest.mark.parametrize("cfg", [
    {"no_rope_layers": [1, 0, 1, 0]},
    {"no_rope_layers": [0, 1, 1, 1, 0, 0]},     # longer than the model: the first 4 count
    {},                                         # every 4th layer NoPE (transformers' default)
    {"no_rope_layer_interval": 2},
], ids=["listed", "longer", "default", "interval"])
def test_smollm3_rope_flags_as_transformers_reads_them(cfg):
    """Which layers rotate, from config.json as written by hand (no list: derived from
    no_rope_layer_interval) or saved by transformers; the rotary base where none is given
    is SmolLM3's (2e6). Other models' layers all rotate."""
    import transformers as tf

    from loom.models.llama import SmolLM3ForCausalLM
    from loom.models.registry import model_class
    hf = tf.SmolLM3Config(**BASE, **cfg)
    for raw in (cfg, _saved(hf)):
        arch = _arch("SmolLM3ForCausalLM", **raw)
        assert [arch.uses_rope(i) for i in range(4)] == [bool(f) for f in hf.no_rope_layers[:4]]
        assert arch.rope_theta == hf.rope_parameters["rope_theta"] == 2e6
        assert model_class(arch) is SmolLM3ForCausalLM
    assert _arch("LlamaForCausalLM", **cfg).rope_layers is None
    assert all(_arch("LlamaForCausalLM", **cfg).uses_rope(i) for i in range(4))


def test_smollm3_nope_layers_have_no_rotary_table():
    from loom.models.llama import SmolLM3ForCausalLM
    model = SmolLM3ForCausalLM(_arch("SmolLM3ForCausalLM", no_rope_layers=[0, 1, 1, 0]))
    assert [layer.self_attn.rotary_emb is None for layer in model.model.layers] == \
        [True, False, False, True]


@pytest.mark.parametrize("cfg, sliding", [
    ({"use_sliding_window": True, "sliding_window": 512}, [3]),        # the NoPE layers
    ({"use_sliding_window": True, "sliding_window": 512, "no_rope_layers": [0, 1, 0, 1]},
     [0, 2]),
    ({"sliding_window": 512}, []),                             # off unless use_sliding_window
    ({"use_sliding_window": True, "sliding_window": 512,
      "layer_types": ["sliding_attention"] * 2 + ["full_attention"] * 2}, [0, 1]),
])
def test_smollm3_sliding_layers_as_transformers_derives_them(cfg, sliding):
    """transformers' SmolLM3 slides its layer_types' sliding_attention layers; where a
    config names none, the NoPE layers under use_sliding_window (off by default)."""
    import transformers as tf
    hf = tf.SmolLM3Config(**BASE, **cfg)
    assert [i for i, kind in enumerate(hf.layer_types) if kind == "sliding_attention"] == sliding
    for raw in (cfg, _saved(hf)):
        arch = _arch("SmolLM3ForCausalLM", **raw)
        assert [i for i in range(4) if arch.window(i) == 512] == sliding
        assert all(arch.window(i) is None for i in range(4) if i not in sliding)


def test_smollm3_configs_loom_refuses():
    with pytest.raises(ValueError, match="no_rope_layers: a 1 .* for each of the 4 layers"):
        _arch("SmolLM3ForCausalLM", no_rope_layers=[1, 0, 1])
    with pytest.raises(ValueError, match="no_rope_layers"):
        _arch("SmolLM3ForCausalLM", no_rope_layers=[1, 2, 1, 0])
    # transformers' masks would slide these layers, its flash attention would not
    with pytest.raises(ValueError, match="layer_types .* use_sliding_window is off"):
        _arch("SmolLM3ForCausalLM", sliding_window=512,
              layer_types=["full_attention", "sliding_attention"] * 2)


def test_modernbert_hub_config_reads_as_transformers_5_reads_it():
    """A Hub ModernBERT config (before transformers 5's layer_types and rope_parameters):
    transformers' own config class is the reference."""
    import transformers as tf
    hub = {"architectures": ["ModernBertModel"], "hidden_size": 64, "num_hidden_layers": 7,
           "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 256,
           "max_position_embeddings": 512, "global_attn_every_n_layers": 3,
           "global_rope_theta": 80000.0, "local_rope_theta": 5000.0, "local_attention": 32,
           "norm_eps": 1e-6, "norm_bias": False, "hidden_activation": "gelu"}
    reference = tf.ModernBertConfig(**{k: v for k, v in hub.items() if k != "architectures"})
    arch = ModelArch.from_hf_config(hub)
    assert arch.sliding_layers == tuple(i for i, t in enumerate(reference.layer_types)
                                        if t == "sliding_attention") == (1, 2, 4, 5)
    assert arch.sliding_window == reference.sliding_window == 16
    assert arch.rope_theta == reference.rope_parameters["full_attention"]["rope_theta"]
    assert arch.local_rope_theta == reference.rope_parameters["sliding_attention"]["rope_theta"]
    assert arch.rms_norm_eps == reference.norm_eps and arch.head_dim == 16
    with pytest.raises(ValueError, match="norm_bias: ModernBERT with biases"):
        ModelArch.from_hf_config({**hub, "norm_bias": True})


YARN = [
    {"factor": 4.0, "original_max_position_embeddings": 128},  # Qwen3's form
    {"factor": 8.0, "original_max_position_embeddings": 64, "beta_fast": 16.0,
     "beta_slow": 2.0, "truncate": False},
    {"factor": 40.0, "original_max_position_embeddings": 8, "mscale": 1.0,
     "mscale_all_dim": 0.707},  # DeepSeek's: attention factor from both mscales
    {"factor": 2.0, "original_max_position_embeddings": 256, "attention_factor": 1.3},
]


@pytest.mark.parametrize("scaling", YARN, ids=["qwen3", "betas-untruncated", "mscales",
                                               "attention-factor"])
def test_yarn_frequencies_and_scale_equal_transformers(scaling):
    """YaRN's rotary frequencies and cos/sin factor against transformers' own
    (`ROPE_INIT_FUNCTIONS["yarn"]`), and the context vLLM derives (pretraining length
    times the factor)."""
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from loom.layers.rotary import RotaryEmbedding, _scaled_inv_freq
    from tests.conftest import TINY
    config = tf.Qwen3Config(**TINY, rope_scaling={"rope_type": "yarn", **scaling})
    want, want_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    arch = ModelArch.from_hf_config({**config.to_dict(),
                                     "architectures": ["Qwen3ForCausalLM"]})
    got = _scaled_inv_freq(arch.head_dim, arch.rope_theta, arch.rope_scaling, None)
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
    assert arch.rope_scaling["attention_factor"] == pytest.approx(want_factor, rel=1e-12)
    assert arch.context_len == int(scaling["original_max_position_embeddings"]
                                   * scaling["factor"])
    table = RotaryEmbedding(arch.head_dim, 8, arch.rope_theta, arch.rope_scaling,
                            magnitude=want_factor).cos_sin_cache
    assert table[0, 0] == pytest.approx(want_factor)  # cos(0), times the factor


def test_linear_scaling_context_is_vllms():
    """vLLM's derived context under linear rope scaling: max_position_embeddings times the
    factor, except Gemma 3's, already the scaled one."""
    linear = {"rope_type": "linear", "factor": 4.0}
    assert _arch("LlamaForCausalLM", rope_scaling=linear).context_len == 4 * 4096
    assert _arch("LlamaForCausalLM", rope_scaling={"type": "linear", "factor": 2}
                 ).context_len == 2 * 4096
    gemma3 = _arch("Gemma3ForCausalLM", sliding_window=512, rope_scaling={**linear, "factor": 8})
    assert gemma3.context_len == 4096


@pytest.mark.parametrize("factor, head_dim", [(2.0, 16), (4.0, 64), (1.5, 128)])
def test_dynamic_ntk_base_is_transformers_at_the_scaled_context(factor, head_dim):
    """Dynamic NTK as vLLM runs it: one set of frequencies, transformers' own
    (`ROPE_INIT_FUNCTIONS["dynamic"]`) for a sequence as long as the scaled context, which
    is max_position_embeddings times the factor."""
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from loom.layers.rotary import _scaled_inv_freq
    from tests.conftest import TINY
    config = tf.LlamaConfig(**dict(TINY, head_dim=head_dim, max_position_embeddings=64),
                            rope_scaling={"rope_type": "dynamic", "factor": factor})
    want, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=int(64 * factor))
    default, _ = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu")  # within 64: the plain base
    arch = ModelArch.from_hf_config({**config.to_dict(), "architectures": ["LlamaForCausalLM"]})
    got = _scaled_inv_freq(arch.head_dim, arch.rope_theta, arch.rope_scaling, None)
    torch.testing.assert_close(got, want.float(), rtol=1e-6, atol=0)
    assert not torch.allclose(got, default.float(), rtol=1e-3)
    assert arch.context_len == int(64 * factor)


@pytest.mark.parametrize("scaling, message", [
    ({"rope_type": "dynamic", "alpha": 1000.0}, "alpha is not supported"),
    ({"type": "dynamic"}, "needs a factor >= 1, got None"),
    ({"rope_type": "dynamic", "factor": 0.5}, "needs a factor >= 1, got 0.5")])
def test_bad_dynamic_ntk_is_refused_by_name(scaling, message):
    with pytest.raises(ValueError, match=message):
        ModelArch.from_hf_config({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                                  "num_attention_heads": 4, "num_hidden_layers": 1,
                                  "intermediate_size": 128, "vocab_size": 256,
                                  "rope_scaling": scaling})
