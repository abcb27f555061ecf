"""How a config.json's rotary embedding and attention windows read, for `ModelArch`: the
rotary base and scaling (rope_theta or rope_parameters, one set per layer type in Gemma 3),
LongRoPE's factors, Gemma 3's local base, the sliding window and the layers it applies to,
SmolLM3's NoPE layers."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


def first(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    """The value of the first of names the config sets (not None), else default."""
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return default


SMOLLM3 = "SmolLM3ForCausalLM"
_DEFAULT_ROPE_THETA = {SMOLLM3: 2e6}
"""transformers' rope_theta where a config gives none, for the models whose is not 10000."""


def rope(cfg: dict[str, Any], architecture: str) -> tuple[float, dict | None]:
    params = dict(cfg.get("rope_parameters") or {})
    if "full_attention" in params:  # Gemma 3 in transformers 5: one set per layer type
        params = dict(params["full_attention"] or {})
    scaling = dict(cfg.get("rope_scaling") or {}) or None
    theta = params.pop("rope_theta", None) or cfg.get("rope_theta") \
        or _DEFAULT_ROPE_THETA.get(architecture, 10000.0)
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = params
    if rope_kind(scaling) == "yarn":
        scaling = yarn_scaling(cfg, scaling)
    if rope_kind(scaling) == "dynamic":
        scaling = dynamic_scaling(cfg, scaling)
    return float(theta), scaling


def dynamic_scaling(cfg: dict[str, Any], scaling: dict) -> dict:
    """Dynamic NTK's rope_scaling, as vLLM runs it: one base for every sequence, the one
    transformers computes for a sequence of the whole scaled context (the pretraining
    length, max_position_embeddings, times the factor); transformers grows the base with
    each sequence past the pretraining length, which a KV cache of keys rotated once can't.
    Its alpha form (Hunyuan's) is refused by name."""
    if "alpha" in scaling:
        raise ValueError("rope_scaling: dynamic NTK with alpha is not supported (factor is)")
    factor = scaling.get("factor")
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor < 1:
        raise ValueError(f"rope_scaling: dynamic NTK needs a factor >= 1, got {factor!r}")
    return {**scaling, "rope_type": "dynamic", "factor": float(factor),
            "original_max_position_embeddings":
                int(first(cfg, "max_position_embeddings", default=2048))}


def yarn_scaling(cfg: dict[str, Any], scaling: dict) -> dict:
    """YaRN's rope_scaling with transformers' defaults filled in: the pretraining length
    (a config-level original_max_position_embeddings first, as Phi-3 keeps it, else
    rope_scaling's, else max_position_embeddings), the factor (else the context's stretch
    over that length), cos and sin's attention_factor (else 0.1 ln(factor) + 1, or the
    ratio of that at mscale and at mscale_all_dim where both are set), beta_fast 32,
    beta_slow 1 and a truncated correction range."""
    max_pos = first(cfg, "max_position_embeddings", default=2048)
    original = first(cfg, "original_max_position_embeddings", default=None) \
        or first(scaling, "original_max_position_embeddings", default=max_pos)
    factor = first(scaling, "factor", default=max_pos / original)
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all)
                     if mscale and mscale_all else _yarn_mscale(factor))
    return {**scaling, "rope_type": "yarn", "factor": float(factor),
            "original_max_position_embeddings": int(original),
            "attention_factor": float(attention),
            "beta_fast": float(scaling.get("beta_fast") or 32),
            "beta_slow": float(scaling.get("beta_slow") or 1),
            "truncate": bool(scaling.get("truncate", True))}


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def scaled_context(scaling: dict | None, max_position_embeddings: int) -> int | None:
    """The context a YaRN-, dynamic-NTK- or linearly scaled model runs, as vLLM derives it:
    the pretraining length (linear's: max_position_embeddings) times the factor (None for
    other kinds: the config's max_position_embeddings)."""
    kind = rope_kind(scaling)
    if kind == "linear":
        return int(max_position_embeddings * float(scaling.get("factor", 1.0)))
    if kind not in ("yarn", "dynamic"):
        return None
    return int(scaling["original_max_position_embeddings"] * scaling["factor"])


def rope_kind(scaling: dict | None) -> str:
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
        max_pos = first(cfg, "max_position_embeddings", default=2048)
        # Phi-3 keeps it beside max_position_embeddings; newer configs in rope_parameters.
        original = first(cfg, "original_max_position_embeddings", default=None) \
            or first(scaling, "original_max_position_embeddings", default=max_pos)
        # transformers' default: the context's stretch over pretraining sets the scale
        factor = first(scaling, "factor", default=max_pos / original)
        attention = first(scaling, "attention_factor", default=None)
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(
                1 + math.log(factor) / math.log(original))
        return cls(short, long, int(original), float(attention))


def long_rope(cfg: dict[str, Any], scaling: dict | None) -> LongRope | None:
    if rope_kind(scaling) not in ("longrope", "su"):
        return None
    return LongRope.from_hf_config(cfg, scaling)


def local_rope_theta(cfg: dict[str, Any]) -> float | None:
    """Gemma 3's (and OLMo 3's) rotary base for its sliding-window layers
    (rope_local_base_freq; in transformers 5 rope_parameters' sliding_attention set), never
    scaled; None where every layer rotates alike."""
    local = (cfg.get("rope_parameters") or {}).get("sliding_attention")
    if local:
        if rope_kind(local) != "default":
            raise ValueError(f"rope_parameters: the sliding layers' rope_type "
                             f"{rope_kind(local)!r} is not supported (default)")
        return float(local.get("rope_theta") or 10000.0)
    base = cfg.get("rope_local_base_freq")
    return None if base is None else float(base)


def sliding_window(cfg: dict[str, Any], architecture: str) -> int | None:
    """The attention window a config's model was trained with, if it uses one: Mistral's,
    Phi-3's and Gemma's sliding_window, Qwen's and SmolLM3's only under use_sliding_window
    (their configs carry a window they do not use; SmolLM3's switch is off by default)."""
    window = cfg.get("sliding_window")
    use = cfg.get("use_sliding_window", architecture != SMOLLM3)
    if architecture == SMOLLM3 and not use and "sliding_attention" in (
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
_WINDOW_PATTERN = {"Gemma2ForCausalLM": 2, "Gemma3ForCausalLM": 6, "Gemma3TextModel": 6,
                   "Olmo3ForCausalLM": 4, "Exaone4ForCausalLM": 4}
"""Every n-th layer attends globally, the others within the window, where a config names
no layer_types (transformers' defaults; Gemma 3 configs may say sliding_window_pattern)."""


def sliding_layers(cfg: dict[str, Any], architecture: str, num_layers: int,
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
    pattern = cfg.get("sliding_window_pattern")
    if isinstance(pattern, str) and pattern:  # EXAONE 4's "LLLG": L local, G global, repeated
        return tuple(i for i in layers if pattern[i % len(pattern)] == "L")
    if architecture in _WINDOW_PATTERN:
        every = pattern or _WINDOW_PATTERN[architecture]
        return tuple(i for i in layers if (i + 1) % every)
    window_layers = cfg.get("max_window_layers", 28)
    if architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        return tuple(i for i in layers if i >= window_layers)
    if architecture == "Qwen2MoeForCausalLM":
        return tuple(i for i in layers if i < window_layers and (i + 1) % 2)
    return tuple(layers)


def rope_layers(cfg: dict[str, Any], architecture: str,
                 num_layers: int) -> tuple[bool, ...] | None:
    """SmolLM3's per-layer rotary flags, as transformers reads config.json's no_rope_layers
    (1: the layer rotates q and k, 0: it does not, NoPE): the first num_layers entries, or
    where there is no list, every no_rope_layer_interval-th layer (default 4) NoPE. None for
    other models: every layer rotates."""
    if architecture != SMOLLM3:
        return None
    flags = cfg.get("no_rope_layers")
    if flags is None:
        every = cfg.get("no_rope_layer_interval") or 4
        return tuple(bool((i + 1) % every) for i in range(num_layers))
    if len(flags) < num_layers or any(f not in (0, 1) for f in flags):
        raise ValueError(f"no_rope_layers: a 1 (RoPE) or 0 (NoPE) for each of the "
                         f"{num_layers} layers expected, got {flags}")
    return tuple(bool(f) for f in flags[:num_layers])
