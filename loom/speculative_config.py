"""`SpeculativeConfig`: vLLM's `--speculative-config`: n-gram prompt lookup, or a smaller
draft model of the same tokenizer.

Nothing here imports torch, so the API server can validate the flag without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from loom.config_checks import check as _check
from loom.config_checks import from_dict as _from_dict

METHODS = ("ngram", "draft_model")
VLLM_METHODS = ("eagle", "eagle3", "medusa", "mlp_speculator", "deepseek_mtp", "mtp", "suffix")
"""vLLM's other proposers: named in the error, so that a user knows they are not here."""

DEFAULT_LOOKUP = 5
"""vLLM's prompt_lookup_min and _max when neither is given."""


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_tokens: int | None = None
    """Draft tokens proposed per step for each request (required)."""
    method: str | None = None
    """The proposer: "ngram" (prompt lookup: the tokens that followed the latest n-gram's
    first earlier occurrence in the request's own prompt and output), or "draft_model"
    (`model`'s greedy tokens; `loom.worker.drafter`)."""
    prompt_lookup_max: int | None = None
    """Longest n-gram matched; tried first. Defaults to prompt_lookup_min, or 5."""
    prompt_lookup_min: int | None = None
    """Shortest n-gram matched. Defaults to prompt_lookup_max, or 5."""
    model: str | None = None
    """draft_model: the draft model (a path or a shipped config, as `--model` takes it);
    also vLLM's older spelling of the method: "[ngram]" (or "ngram"), and any other value
    without a method means draft_model."""
    draft_tensor_parallel_size: int | None = None
    """The draft model's TP size: 1 (the default: whole on the driver's GPU beside its shard
    of the target), or the target's tensor_parallel_size (sharded like the target, every
    rank drafting; `EngineConfig` checks it)."""

    def __post_init__(self) -> None:
        method = self.method
        if method is None and self.model is not None:
            spelled = str(self.model).strip("[]")
            method = spelled if spelled == "ngram" else "draft_model"
        _check(method is not None, "speculative_config.method: required (supported: "
                                   f"{', '.join(METHODS)})")
        _check(method not in VLLM_METHODS,
               f"speculative_config.method: {method!r} is not implemented by loom; supported: "
               f"{', '.join(METHODS)}")
        _check(method in METHODS, f"speculative_config.method: {method!r} is not one of "
                                  f"{METHODS}")
        object.__setattr__(self, "method", method)
        k = self.num_speculative_tokens
        _check(type(k) is int and k >= 1, "speculative_config.num_speculative_tokens: required, "
                                          f"a positive integer, got {k!r}")
        if method == "draft_model":
            self._check_draft()
            return
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        for name, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            _check(value is None or (type(value) is int and value >= 1),
                   f"speculative_config.{name}: must be a positive integer, got {value!r}")
        low = low if low is not None else high if high is not None else DEFAULT_LOOKUP
        high = high if high is not None else low
        _check(low <= high, f"speculative_config.prompt_lookup_min ({low}) must not exceed "
                            f"prompt_lookup_max ({high})")
        object.__setattr__(self, "prompt_lookup_min", low)
        object.__setattr__(self, "prompt_lookup_max", high)

    def _check_draft(self) -> None:
        _check(isinstance(self.model, str) and bool(self.model),
               "speculative_config.model: required for method draft_model (the draft "
               "model's path)")
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            _check(getattr(self, name) is None,
                   f"speculative_config.{name}: is an n-gram setting, not draft_model's")
        tp = self.draft_tensor_parallel_size
        _check(tp is None or (type(tp) is int and tp >= 1),
               f"speculative_config.draft_tensor_parallel_size: a positive integer, got {tp!r}")

    @property
    def lookahead(self) -> int:
        """KV slots past a step's tokens that its drafts are written into (a draft model
        computes its drafts' KV; n-gram lookup computes none)."""
        return self.num_speculative_tokens if self.method == "draft_model" else 0

    @property
    def sharded_draft(self) -> bool:
        """Whether the draft model is sharded over the TP ranks (draft TP above 1)."""
        return (self.draft_tensor_parallel_size or 1) > 1

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict | str | None) -> SpeculativeConfig | None:
        """Accept an object, a dict or a JSON string (`--speculative-config '{...}'`)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config: not valid JSON ({e.msg}): "
                                 f"{value!r}") from None
        _check(isinstance(value, dict),
               f"speculative_config: expected a JSON object, got {type(value).__name__}")
        return _from_dict(cls, value, "speculative_config")
