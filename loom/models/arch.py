"""`ModelArch`: the fields of a Hugging Face config.json that loom's models read, typed.

Config files differ across transformers versions (rope_theta vs rope_parameters,
num_experts vs num_local_experts, torch_dtype vs dtype, rope_scaling's "su" vs "longrope",
Gemma's sliding_window_pattern vs layer_types) and across architectures (Mixtral's experts
are intermediate_size wide, Qwen's moe_intermediate_size); this is the one place that knows,
so model files never touch a raw dict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loom.models.arch_rope import (LongRope, first, local_rope_theta, long_rope, rope,
                                   rope_layers, scaled_context, sliding_layers,
                                   sliding_window)
from loom.models.modernbert_config import MODERNBERT, modernbert_config
from loom.models.seq_cls_config import classifier_from_token, from_token_labels


def _refuse_unsupported(cfg: dict[str, Any], architecture: str) -> None:
    if "hidden_size" not in cfg and "text_config" in cfg:
        raise ValueError(f"{architecture}: a multimodal model (its language model's config "
                         "is nested in text_config) is not supported; loom runs text-only "
                         "models (for Gemma 3: Gemma3ForCausalLM checkpoints, such as "
                         "gemma-3-1b)")
    if is_encoder(architecture) and cfg.get("position_embedding_type",
                                            "absolute") != "absolute":
        raise ValueError(f"{architecture}: position_embedding_type "
                         f"{cfg['position_embedding_type']!r} is not supported (absolute)")
    if architecture == "Gemma3TextModel" and not cfg.get("use_bidirectional_attention"):
        raise ValueError("Gemma3TextModel: loom runs it as EmbeddingGemma, both ways; this "
                         "config's use_bidirectional_attention is off (a causal Gemma 3 "
                         "loads as Gemma3ForCausalLM)")
    if cfg.get("use_bidirectional_attention") and architecture != "Gemma3TextModel":
        raise ValueError(f"{architecture}: use_bidirectional_attention (an embedding "
                         "model's) is not supported; loom's attention is causal")


def _norm_topk_prob(cfg: dict[str, Any], architecture: str) -> bool:
    # Mixtral's router always renormalises its top k (its config has no switch), and so does
    # GraniteMoe's (a softmax over the top k logits); Qwen's MoE configs default to not
    # (transformers' Qwen2MoeConfig and Qwen3MoeConfig).
    if architecture in ("MixtralForCausalLM", "GraniteMoeForCausalLM"):
        return True
    return bool(cfg.get("norm_topk_prob", False))


def _partial_rotary_factor(cfg: dict[str, Any]) -> float:
    params = cfg.get("rope_parameters") or {}
    return float(first(params, "partial_rotary_factor", default=None)
                 or first(cfg, "partial_rotary_factor", default=1.0))


def _attention_multiplier(cfg: dict[str, Any], architecture: str) -> float | None:
    """Granite's softmax scale; transformers' GraniteConfig defaults it to 1.0 (not
    head_dim ** -0.5) where config.json leaves it out. None for other models."""
    value = cfg.get("attention_multiplier")
    if value is None and architecture.startswith("Granite"):
        value = 1.0
    return None if value is None else float(value)


def num_labels(cfg: dict[str, Any]) -> int:
    """A classifier's outputs as transformers counts them: num_labels where the config says,
    else one per id2label entry, else its default of 2."""
    converted = from_token_labels(cfg)
    if converted is not None:
        return converted
    if cfg.get("num_labels") is not None:
        return int(cfg["num_labels"])
    return len(cfg["id2label"]) if cfg.get("id2label") else 2


ENCODERS = ("BertModel", "RobertaModel", "XLMRobertaModel", "ModernBertModel", "Gemma3TextModel",
            "BertForSequenceClassification", "RobertaForSequenceClassification",
            "XLMRobertaForSequenceClassification", "ModernBertForSequenceClassification")
"""Encoder-only models (`loom.models.bert`): both-ways attention, whole prompts; embedding
models, and classifiers (cross-encoder rerankers such as bge-reranker, ms-marco-MiniLM)."""
_ROBERTA = ("RobertaModel", "XLMRobertaModel", "RobertaForSequenceClassification",
            "XLMRobertaForSequenceClassification")


def _hidden_act(cfg: dict[str, Any], architecture: str) -> str:
    act = first(cfg, "hidden_activation", "hidden_act", default="silu")
    if architecture == "GemmaForCausalLM" and act == "gelu":
        return "gelu_pytorch_tanh"  # the releases' legacy name, as transformers reads it
    return act


def is_encoder(architecture: str) -> bool:
    return architecture in ENCODERS


BASE_MODELS = {"LlamaModel": "LlamaForCausalLM", "MistralModel": "MistralForCausalLM",
               "Qwen2Model": "Qwen2ForCausalLM", "Qwen3Model": "Qwen3ForCausalLM",
               "GemmaModel": "GemmaForCausalLM", "Gemma2Model": "Gemma2ForCausalLM"}
"""A decoder saved without its LM head (transformers' base model class), as embedding
models ship (e5-mistral, bge-multilingual-gemma2) -> the causal LM whose layers it has."""


def is_base_model(architecture: str) -> bool:
    return architecture in BASE_MODELS


def _position_offset(cfg: dict[str, Any], architecture: str) -> int:
    """RoBERTa counts positions from padding_idx + 1 (2 with pad 1): the table's first rows
    are never read, and its context is that much shorter."""
    if architecture not in _ROBERTA:
        return 0
    return (1 if cfg.get("pad_token_id") is None else int(cfg["pad_token_id"])) + 1


def is_classifier(architecture: str) -> bool:
    """A decoder with a classification head on its last token (vLLM's *ForSequenceClassification)."""
    return architecture.endswith("ForSequenceClassification")


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


@dataclass(frozen=True)
class ModelArch:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    dtype: str | None
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    attention_out_bias: bool | None = None
    """Seed-OSS's: o_proj's own bias flag (None: attention_bias, where q/k/v carry none)."""
    mlp_bias: bool = False
    """Biases on gate, up and down (Llama's mlp_bias, Seed-OSS's)."""
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    shared_expert_intermediate_size: int = 0
    """Qwen2-MoE's shared expert, an MLP beside the routed ones in every MoE layer (0: none)."""
    sliding_window: int | None = None
    """The attention window, where the model was trained with one (None: full attention);
    `window` says which layers use it."""
    sliding_layers: tuple[int, ...] = ()
    """The layers that attend within sliding_window (Gemma's local layers; every layer of
    Mistral v0.1 and Phi-3)."""
    max_context: int | None = None
    """A cap on context_len: the window, under --disable-sliding-window (`WINDOW_CAP`)."""
    local_rope_theta: float | None = None
    """The sliding layers' own rotary base, unscaled (Gemma 3); None: rope_theta's."""
    query_pre_attn_scalar: float | None = None
    """Gemma's softmax scale is this ** -0.5 (None: head_dim ** -0.5)."""
    attn_logit_softcapping: float | None = None
    """Gemma 2: attention scores s become tanh(s / cap) * cap before the softmax."""
    final_logit_softcapping: float | None = None
    """Gemma 2: the logits likewise."""
    embedding_multiplier: float = 1.0
    """Granite: the token embeddings are multiplied by this."""
    residual_multiplier: float = 1.0
    """Granite: each attention and MLP output, before it joins the residual stream."""
    attention_multiplier: float | None = None
    """Granite's softmax scale, where it replaces head_dim ** -0.5 (None: not given)."""
    logits_scaling: float = 1.0
    """Granite: the logits are divided by this."""
    rope_layers: tuple[bool, ...] | None = None
    """Per layer, whether it rotates q and k (SmolLM3's no_rope_layers; False: a NoPE
    layer); None: every layer does. `uses_rope` reads it."""
    hidden_act: str = "silu"
    """The gated MLP's activation (Gemma's gelu_pytorch_tanh)."""
    long_rope: LongRope | None = None
    partial_rotary_factor: float = 1.0
    """The share of each head's dimensions that rotary embedding turns (Phi-4-mini: 0.75)."""
    num_labels: int = 0
    """A *ForSequenceClassification model's classes, its score head's rows (0: no head)."""
    pad_token_id: int | None = None
    """config.json's: a classifier reads the last token that is not this one."""
    type_vocab_size: int = 0
    """An encoder's token type embeddings (BERT's segments)."""
    position_offset: int = 0
    """An encoder's first position's row in its position table (`_position_offset`)."""
    classifier_pooling: str = "cls"
    """What a ModernBERT classifier's head reads: the first row (cls) or their mean."""
    classifier_from_token: tuple[str, ...] = ()
    """A causal LM reranker loaded as a classifier: the tokens whose LM-head rows make its
    score head (`loom.models.seq_cls_config`), by classifier_method."""
    classifier_method: str = ""

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelArch:
        archs = cfg.get("architectures") or []
        if not archs:
            raise ValueError("config.json has no 'architectures' entry: cannot pick a model class")
        if archs[0] in MODERNBERT:
            cfg = modernbert_config(cfg)
        _refuse_unsupported(cfg, archs[0])
        heads = cfg["num_attention_heads"]
        window = sliding_window(cfg, archs[0])
        theta, scaling = rope(cfg, archs[0])
        rope_flags = rope_layers(cfg, archs[0], cfg["num_hidden_layers"])
        experts = first(cfg, "num_experts", "num_local_experts", default=0)
        return cls(
            architecture=archs[0], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg.get("intermediate_size", 0), num_layers=cfg["num_hidden_layers"],
            num_heads=heads, num_kv_heads=first(cfg, "num_key_value_heads", default=heads),
            head_dim=first(cfg, "head_dim", default=cfg["hidden_size"] // heads),
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=first(cfg, "rms_norm_eps", "layer_norm_eps", default=1e-6),
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=first(cfg, "max_position_embeddings", default=2048),
            # A base model has no LM head: the (never applied) head shares the embeddings.
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False))
            or is_base_model(archs[0]) or is_encoder(archs[0]),
            # ERNIE 4.5's use_bias: one flag for every projection
            attention_bias=bool(first(cfg, "attention_bias", "use_bias", default=False)),
            attention_out_bias=(None if first(cfg, "attention_out_bias", "use_bias") is None
                                else bool(first(cfg, "attention_out_bias", "use_bias"))),
            mlp_bias=bool(first(cfg, "mlp_bias", "use_bias", default=False)),
            dtype=first(cfg, "torch_dtype", "dtype"), bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
            num_experts=experts, num_experts_per_tok=first(cfg, "num_experts_per_tok", default=0),
            # Mixtral's experts are intermediate_size wide; Qwen's have their own size.
            moe_intermediate_size=first(cfg, "moe_intermediate_size", default=cfg.get(
                "intermediate_size", 0) if experts else 0),
            norm_topk_prob=_norm_topk_prob(cfg, archs[0]),
            decoder_sparse_step=first(cfg, "decoder_sparse_step", default=1),
            mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()),
            shared_expert_intermediate_size=first(cfg, "shared_expert_intermediate_size",
                                                   default=0),
            sliding_window=window, long_rope=long_rope(cfg, scaling),
            max_context=cfg.get(WINDOW_CAP),
            sliding_layers=sliding_layers(cfg, archs[0], cfg["num_hidden_layers"],
                                           rope_flags) if window else (),
            partial_rotary_factor=_partial_rotary_factor(cfg),
            local_rope_theta=local_rope_theta(cfg),
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar"),
            attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
            final_logit_softcapping=cfg.get("final_logit_softcapping"),
            hidden_act=_hidden_act(cfg, archs[0]),
            embedding_multiplier=float(first(cfg, "embedding_multiplier", default=1.0)),
            residual_multiplier=float(first(cfg, "residual_multiplier", default=1.0)),
            attention_multiplier=_attention_multiplier(cfg, archs[0]),
            logits_scaling=float(first(cfg, "logits_scaling", default=1.0)),
            rope_layers=rope_flags,
            num_labels=num_labels(cfg) if is_classifier(archs[0]) else 0,
            pad_token_id=cfg.get("pad_token_id"),
            type_vocab_size=int(cfg.get("type_vocab_size", 0)),
            position_offset=_position_offset(cfg, archs[0]),
            classifier_pooling=cfg.get("classifier_pooling", "cls"),
            classifier_from_token=classifier_from_token(cfg)[0],
            classifier_method=classifier_from_token(cfg)[1],
        )

    def check_tensor_parallel(self, tp: int) -> None:
        """ValueError, before any worker starts, if the layers cannot be split tp ways."""
        if tp == 1:
            return
        if is_encoder(self.architecture):
            raise ValueError(f"tensor_parallel_size: {self.architecture} (an encoder) runs on "
                             f"one device, got {tp}; serve replicas with -dp instead")
        if self.architecture in ("Olmo2ForCausalLM", "Olmo3ForCausalLM"):
            raise ValueError(f"tensor_parallel_size: {self.architecture} runs on one device "
                             f"here, got {tp} (its q/k norms span every head, which TP would "
                             "split); serve replicas with -dp instead")
        problems = []
        if self.num_heads % tp:
            problems.append(f"attention heads ({self.num_heads})")
        kv = self.num_kv_heads
        if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
            problems.append(f"KV heads ({kv}; fewer than the TP size must divide it)")
        dense = any(not self.is_moe_layer(i) for i in range(self.num_layers))
        if dense and self.intermediate_size % tp:
            problems.append(f"MLP intermediate size ({self.intermediate_size})")
        if self.num_experts and self.moe_intermediate_size % tp:
            problems.append(f"expert intermediate size ({self.moe_intermediate_size})")
        if self.num_experts and self.shared_expert_intermediate_size % tp:
            problems.append(f"shared expert intermediate size "
                            f"({self.shared_expert_intermediate_size})")
        if problems:
            raise ValueError(f"tensor_parallel_size: {self.architecture}'s "
                             f"{', '.join(problems)} must be divisible by the tensor-parallel "
                             f"size ({tp})")

    def is_moe_layer(self, layer_idx: int) -> bool:
        return (self.num_experts > 0 and layer_idx not in self.mlp_only_layers
                and (layer_idx + 1) % self.decoder_sparse_step == 0)

    def window(self, layer_idx: int) -> int | None:
        """The layer's sliding window (`ScoreOpts.sliding_window`), or None."""
        return self.sliding_window if layer_idx in self.sliding_layers else None

    def uses_rope(self, layer_idx: int) -> bool:
        """Whether the layer rotates q and k (False: SmolLM3's NoPE layers)."""
        return self.rope_layers is None or self.rope_layers[layer_idx]

    @property
    def attn_scale(self) -> float:
        if self.attention_multiplier is not None:
            return self.attention_multiplier
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def context_len(self) -> int:
        """The longest sequence loom runs: the model's context (sliding windows are
        honoured, so they no longer cap it); under YaRN, dynamic NTK or linear scaling, as
        vLLM derives it, the pretraining length times the factor (not Gemma 3's, whose
        max_position_embeddings is already the scaled context, as vLLM notes)."""
        scaled = (None if self.architecture.startswith("Gemma3")
                  else scaled_context(self.rope_scaling, self.max_position_embeddings))
        length = (scaled or self.max_position_embeddings) - self.position_offset
        return min(length, self.max_context or length)

    @property
    def gated_mlp(self) -> bool:
        """gate and up projections (False: Arcee's lone up_proj)."""
        return self.architecture != "ArceeForCausalLM"

    @property
    def interleaved_rope(self) -> bool:
        """Its rotary pairs are interleaved features (`loom.models.interleaved_rope`)."""
        return self.architecture in ("Glm4ForCausalLM", "Ernie4_5ForCausalLM")

    @property
    def fused_checkpoint(self) -> bool:
        """The checkpoint (and LoRA adapters trained on it) holds q/k/v and gate/up as one
        qkv_proj and one gate_up_proj each (Phi-3), not as separate projections."""
        return self.architecture == "Phi3ForCausalLM"

    @property
    def num_params(self) -> int:
        """Parameters of the decoder layers one token's matmuls touch (no embedding, no LM
        head), for FLOP floors."""
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        dense = 3 * self.hidden_size * self.intermediate_size
        moe = 3 * self.hidden_size * (self.moe_intermediate_size * self.num_experts_per_tok
                                      + self.shared_expert_intermediate_size)
        mlp = sum(moe if self.is_moe_layer(i) else dense for i in range(self.num_layers))
        return self.num_layers * attn + mlp


WINDOW_CAP = "loom_max_context"
"""The config key `without_sliding_window` sets: the longest sequence, the window's length."""


def without_sliding_window(hf_config: dict[str, Any]) -> dict[str, Any]:
    """vLLM's --disable-sliding-window: a model with a window runs sequences no longer than
    it, where windowed attention is full attention (its layers and rotary are unchanged)."""
    window = ModelArch.from_hf_config(hf_config).sliding_window
    return {**hf_config, WINDOW_CAP: window} if window else hf_config


def resolve_max_model_len(requested: int | None, model_limit: int) -> int:
    """requested, or the model's limit (`ModelArch.context_len`). A sliding window does not
    cap it (loom's attention honours windows), unless --disable-sliding-window asks."""
    if requested is None:
        return model_limit
    if requested > model_limit:
        raise ValueError(f"max_model_len: {requested} exceeds the model's context length "
                         f"({model_limit})")
    return requested
