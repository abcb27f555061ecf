"""vLLM's conversion of a causal LM reranker into a classifier as it loads (torch-free: the
API process reads it too): config.json (or --hf-overrides) names
`classifier_from_token`, tokens whose LM-head rows become the score head's, and `method`:

- from_2_way_softmax (Qwen3-Reranker's "no", "yes"; mxbai-rerank-v2's "0", "1"): one row,
  the second token's minus the first's, so that sigmoid(score) is the softmax of the two
  tokens' logits (`is_original_qwen3_reranker: true` says this, with ["no", "yes"]);
- no_post_processing (bge-reranker-v2-gemma's "Yes"): a row per token, their logits as is.
"""

from __future__ import annotations

from typing import Any

METHODS = ("from_2_way_softmax", "no_post_processing")


def classifier_from_token(cfg: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    """(tokens, method), or ((), "") for a classifier with its own head."""
    if cfg.get("is_original_qwen3_reranker"):
        tokens = cfg.get("classifier_from_token") or ["no", "yes"]
        method = cfg.get("method") or "from_2_way_softmax"
    else:
        tokens, method = cfg.get("classifier_from_token"), cfg.get("method")
    if not tokens:
        return (), ""
    if not (isinstance(tokens, list) and all(isinstance(t, str) for t in tokens)):
        raise ValueError(f"classifier_from_token: a list of token strings, got {tokens!r}")
    if method not in METHODS:
        raise ValueError(f"method: how classifier_from_token's rows become the score head "
                         f"({', '.join(METHODS)}), got {method!r}")
    if method == "from_2_way_softmax" and len(tokens) != 2:
        raise ValueError(f"classifier_from_token: from_2_way_softmax takes two tokens, got "
                         f"{tokens}")
    return tuple(tokens), method


def from_token_labels(cfg: dict[str, Any]) -> int | None:
    """The score head's rows a converted reranker has (None: not one)."""
    tokens, method = classifier_from_token(cfg)
    if not tokens:
        return None
    return 1 if method == "from_2_way_softmax" else len(tokens)
