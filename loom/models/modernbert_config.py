"""ModernBERT's config.json in the fields loom's other models use (torch-free: `ModelArch`
reads it in the API process too).

Hub configs predate transformers 5's: global_attn_every_n_layers (every n-th layer from the
first attends globally, the others locally) and global_rope_theta / local_rope_theta
where transformers 5 writes layer_types and rope_parameters. local_attention is the whole
window: a token sees those at most local_attention // 2 positions away, both ways.
"""

from __future__ import annotations

from typing import Any

MODERNBERT = ("ModernBertModel", "ModernBertForSequenceClassification")
_THETA = {"full_attention": ("global_rope_theta", 160000.0),
          "sliding_attention": ("local_rope_theta", 10000.0)}


def modernbert_config(cfg: dict[str, Any]) -> dict[str, Any]:
    for flag in ("norm_bias", "mlp_bias", "attention_bias"):
        if cfg.get(flag):
            raise ValueError(f"{flag}: ModernBERT with biases is not supported (its "
                             "checkpoints have none)")
    if cfg.get("classifier_bias") or cfg.get("classifier_activation", "gelu") != "gelu":
        raise ValueError("classifier_bias / classifier_activation: loom's ModernBERT head is "
                         "the checkpoints' (no bias, gelu)")
    if cfg.get("classifier_pooling", "cls") not in ("cls", "mean"):
        raise ValueError(f"classifier_pooling: {cfg['classifier_pooling']!r} is not cls or "
                         "mean")
    layers = cfg["num_hidden_layers"]
    every = cfg.get("global_attn_every_n_layers", 3)
    types = cfg.get("layer_types") or ["sliding_attention" if i % every else "full_attention"
                                       for i in range(layers)]
    given = cfg.get("rope_parameters") or {}
    rope = {}
    for kind, (old_key, default) in _THETA.items():
        params = dict(given.get(kind) or {"rope_type": "default"})
        params.setdefault("rope_theta", cfg.get(old_key, default))
        rope[kind] = params
    return {**cfg, "layer_types": types, "rope_parameters": rope,
            "sliding_window": cfg.get("local_attention", 128) // 2,
            "layer_norm_eps": cfg.get("norm_eps", 1e-5), "head_dim": cfg["hidden_size"]
            // cfg["num_attention_heads"]}
