"""`ModelArch`: the fields of a Hugging Face config.json that loom's models read, typed.

Config files differ across transformers versions (rope_theta vs rope_parameters,
num_experts vs num_local_experts, torch_dtype vs dtype, rope_scaling's "su" vs "longrope",
Gemma's sliding_window_pattern vs layer_types) and across architectures (Mixtral's experts
are intermediate_size wide, Qwen's moe_intermediate_size); this is the one place that knows,
so model files never touch a raw dict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from loom.models.modernbert_config import MODERNBERT, modernbert_config
from loom.models.seq_cls_config import classifier_from_token, from_token_labels


def _first(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return default


_SMOLLM3 = "SmolLM3ForCausalLM"
_DEFAULT_ROPE_THETA = {_SMOLLM3: 2e6}
"""transformers' rope_theta where a config gives none, for the models whose is not 10000."""


def _rope(cfg: dict[str, Any], architecture: str) -> tuple[float, dict | None]:
    params = dict(cfg.get("rope_parameters") or {})
    if "full_attention" in params:  # Gemma 3 in transformers 5: one set per layer type
        params = dict(params["full_attention"] or {})
    scaling = dict(cfg.get("rope_scaling") or {}) or None
    theta = params.pop("rope_theta", None) or cfg.get("rope_theta") \
        or _DEFAULT_ROPE_THETA.get(architecture, 10000.0)
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = params
    return float(theta), scaling


def _rope_kind(scaling: dict | None) -> str:
    return (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))


@dataclass(frozen=True)
class LongRope:
    """Phi-3's LongRoPE (rope_scaling type "longrope", once "su"): each rotary frequency is
    divided by its own factor, from one list for sequences within the pretraining length
    and another beyond it, and cos and sin are scaled by attention_factor."""
    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position_embeddings: int
    attention_factor: float

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], scaling: dict) -> LongRope:
        try:
            short, long = tuple(scaling["short_factor"]), tuple(scaling["long_factor"])
        except KeyError as e:
            raise ValueError(f"rope_scaling: LongRoPE needs short_factor and long_factor; "
                             f"{e.args[0]} is missing") from None
        max_pos = _first(cfg, "max_position_embeddings", default=2048)
        # Phi-3 keeps it beside max_position_embeddings; newer configs in rope_parameters.
        original = _first(cfg, "original_max_position_embeddings", default=None) \
            or _first(scaling, "original_max_position_embeddings", default=max_pos)
        # transformers' default: the context's stretch over pretraining sets the scale
        factor = _first(scaling, "factor", default=max_pos / original)
        attention = _first(scaling, "attention_factor", default=None)
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(
                1 + math.log(factor) / math.log(original))
        return cls(short, long, int(original), float(attention))


def _long_rope(cfg: dict[str, Any], scaling: dict | None) -> LongRope | None:
    if _rope_kind(scaling) not in ("longrope", "su"):
        return None
    return LongRope.from_hf_config(cfg, scaling)


def _local_rope_theta(cfg: dict[str, Any]) -> float | None:
    """Gemma 3's rotary base for its sliding-window layers (rope_local_base_freq; in
    transformers 5 rope_parameters' sliding_attention set), never scaled; None where every
    layer rotates alike."""
    local = (cfg.get("rope_parameters") or {}).get("sliding_attention")
    if local:
        if _rope_kind(local) != "default":
            raise ValueError(f"rope_parameters: the sliding layers' rope_type "
                             f"{_rope_kind(local)!r} is not supported (default)")
        return float(local.get("rope_theta") or 10000.0)
    base = cfg.get("rope_local_base_freq")
    return None if base is None else float(base)


def _sliding_window(cfg: dict[str, Any], architecture: str) -> int | None:
    """The attention window a config's model was trained with, if it uses one: Mistral's,
    Phi-3's and Gemma's sliding_window, Qwen's and SmolLM3's only under use_sliding_window
    (their configs carry a window they do not use; SmolLM3's switch is off by default)."""
    window = cfg.get("sliding_window")
    use = cfg.get("use_sliding_window", architecture != _SMOLLM3)
    if architecture == _SMOLLM3 and not use and "sliding_attention" in (
            cfg.get("layer_types") or ()):
        # transformers' masks (eager, SDPA) slide those layers; its flash attention does not
        raise ValueError("SmolLM3: layer_types names sliding_attention layers while "
                         "use_sliding_window is off, which transformers' attention "
                         "implementations read differently; set use_sliding_window (and "
                         "sliding_window) or make them full_attention")
    if not window or not use:
        return None
    return int(window)


_LAYER_TYPES = ("sliding_attention", "full_attention")
_WINDOW_PATTERN = {"Gemma2ForCausalLM": 2, "Gemma3ForCausalLM": 6, "Gemma3TextModel": 6}
"""Every n-th layer attends globally, the others within the window, where a config names
no layer_types (transformers' defaults; Gemma 3 configs may say sliding_window_pattern)."""


def _sliding_layers(cfg: dict[str, Any], architecture: str, num_layers: int,
                    rope_layers: tuple[bool, ...] | None) -> tuple[int, ...]:
    """The layers that attend within the sliding window: those the config's layer_types
    call sliding_attention, else as transformers derives them for the architecture (Qwen's
    from max_window_layers, SmolLM3's NoPE layers), else every layer (Mistral, Phi-3)."""
    types = cfg.get("layer_types")
    if types:
        unknown = sorted(set(types) - set(_LAYER_TYPES))
        if unknown or len(types) != num_layers:
            raise ValueError(f"layer_types: {num_layers} entries of {', '.join(_LAYER_TYPES)} "
                             f"expected, got {len(types)}" + (f" with {unknown}" if unknown else ""))
        return tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
    layers = range(num_layers)
    if rope_layers is not None:
        return tuple(i for i in layers if not rope_layers[i])
    if architecture in _WINDOW_PATTERN:
        every = cfg.get("sliding_window_pattern") or _WINDOW_PATTERN[architecture]
        return tuple(i for i in layers if (i + 1) % every)
    window_layers = cfg.get("max_window_layers", 28)
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        return tuple(i for i in layers if i >= window_layers)
    if architecture == "Qwen2MoeForCausalLM":
        return tuple(i for i in layers if i < window_layers and (i + 1) % 2)
    return tuple(layers)


def _rope_layers(cfg: dict[str, Any], architecture: str,
                 num_layers: int) -> tuple[bool, ...] | None:
    """SmolLM3's per-layer rotary flags, as transformers reads config.json's no_rope_layers
    (1: the layer rotates q and k, 0: it does not, NoPE): the first num_layers entries, or
    where there is no list, every no_rope_layer_interval-th layer (default 4) NoPE. None for
    other models: every layer rotates."""
    if architecture != _SMOLLM3:
        return None
    flags = cfg.get("no_rope_layers")
    if flags is None:
        every = cfg.get("no_rope_layer_interval") or 4
        return tuple(bool((i + 1) % every) for i in range(num_layers))
    if len(flags) < num_layers or any(f not in (0, 1) for f in flags):
        raise ValueError(f"no_rope_layers: a 1 (RoPE) or 0 (NoPE) for each of the "
                         f"{num_layers} layers expected, got {flags}")
    return tuple(bool(f) for f in flags[:num_layers])


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
    return float(_first(params, "partial_rotary_factor", default=None)
                 or _first(cfg, "partial_rotary_factor", default=1.0))


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


def is_encoder(architecture: str) -> bool:
    return architecture in ENCODERS


BASE_MODELS = {"LlamaModel": "LlamaForCausalLM", "MistralModel": "MistralForCausalLM",
               "Qwen2Model": "Qwen2ForCausalLM", "Qwen3Model": "Qwen3ForCausalLM",
               "Gemma2Model": "Gemma2ForCausalLM"}
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
        window = _sliding_window(cfg, archs[0])
        theta, scaling = _rope(cfg, archs[0])
        rope_layers = _rope_layers(cfg, archs[0], cfg["num_hidden_layers"])
        experts = _first(cfg, "num_experts", "num_local_experts", default=0)
        return cls(
            architecture=archs[0], hidden_size=cfg["hidden_size"],
            intermediate_size=cfg.get("intermediate_size", 0), num_layers=cfg["num_hidden_layers"],
            num_heads=heads, num_kv_heads=_first(cfg, "num_key_value_heads", default=heads),
            head_dim=_first(cfg, "head_dim", default=cfg["hidden_size"] // heads),
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=_first(cfg, "rms_norm_eps", "layer_norm_eps", default=1e-6),
            rope_theta=theta, rope_scaling=scaling,
            max_position_embeddings=_first(cfg, "max_position_embeddings", default=2048),
            # A base model has no LM head: the (never applied) head shares the embeddings.
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False))
            or is_base_model(archs[0]) or is_encoder(archs[0]),
            attention_bias=bool(cfg.get("attention_bias", False)),
            dtype=_first(cfg, "torch_dtype", "dtype"), bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
            num_experts=experts, num_experts_per_tok=_first(cfg, "num_experts_per_tok", default=0),
            # Mixtral's experts are intermediate_size wide; Qwen's have their own size.
            moe_intermediate_size=_first(cfg, "moe_intermediate_size", default=cfg.get(
                "intermediate_size", 0) if experts else 0),
            norm_topk_prob=_norm_topk_prob(cfg, archs[0]),
            decoder_sparse_step=_first(cfg, "decoder_sparse_step", default=1),
            mlp_only_layers=tuple(cfg.get("mlp_only_layers") or ()),
            shared_expert_intermediate_size=_first(cfg, "shared_expert_intermediate_size",
                                                   default=0),
            sliding_window=window, long_rope=_long_rope(cfg, scaling),
            sliding_layers=_sliding_layers(cfg, archs[0], cfg["num_hidden_layers"],
                                           rope_layers) if window else (),
            partial_rotary_factor=_partial_rotary_factor(cfg),
            local_rope_theta=_local_rope_theta(cfg),
            query_pre_attn_scalar=cfg.get("query_pre_attn_scalar"),
            attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
            final_logit_softcapping=cfg.get("final_logit_softcapping"),
            hidden_act=_first(cfg, "hidden_activation", "hidden_act", default="silu"),
            embedding_multiplier=float(_first(cfg, "embedding_multiplier", default=1.0)),
            residual_multiplier=float(_first(cfg, "residual_multiplier", default=1.0)),
            attention_multiplier=_attention_multiplier(cfg, archs[0]),
            logits_scaling=float(_first(cfg, "logits_scaling", default=1.0)),
            rope_layers=rope_layers,
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
        honoured, so they no longer cap it)."""
        return self.max_position_embeddings - self.position_offset

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
