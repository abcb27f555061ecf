"""`SpeculativeConfig`: vLLM's `--speculative-config` (n-gram prompt lookup only).

Nothing here imports torch, so the API server can validate the flag without it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from loom.config_checks import check as _check
from loom.config_checks import from_dict as _from_dict

METHODS = ("ngram",)
VLLM_METHODS = ("eagle", "eagle3", "medusa", "mlp_speculator", "draft_model", "deepseek_mtp",
                "mtp", "suffix")
"""vLLM's other proposers: named in the error, so that a user knows they are not here."""

DEFAULT_LOOKUP = 5
"""vLLM's prompt_lookup_min and _max when neither is given."""


@dataclass(frozen=True)
class SpeculativeConfig:
    num_speculative_tokens: int | None = None
    """Draft tokens proposed per step for each request (required)."""
    method: str | None = None
    """The proposer: "ngram" (prompt lookup: the tokens that followed the latest n-gram's
    first earlier occurrence in the request's own prompt and output)."""
    prompt_lookup_max: int | None = None
    """Longest n-gram matched; tried first. Defaults to prompt_lookup_min, or 5."""
    prompt_lookup_min: int | None = None
    """Shortest n-gram matched. Defaults to prompt_lookup_max, or 5."""
    model: str | None = None
    """vLLM's older spelling of the method: "[ngram]" (or "ngram")."""

    def __post_init__(self) -> None:
        method = self.method
        if method is None and self.model is not None:
            method = str(self.model).strip("[]")
        _check(method is not None, "speculative_config.method: required (supported: ngram)")
        _check(method not in VLLM_METHODS,
               f"speculative_config.method: {method!r} is not implemented by loom; supported: "
               f"{', '.join(METHODS)}")
        _check(method in METHODS, f"speculative_config.method: {method!r} is not one of "
                                  f"{METHODS}")
        object.__setattr__(self, "method", method)
        k = self.num_speculative_tokens
        _check(type(k) is int and k >= 1, "speculative_config.num_speculative_tokens: required, "
                                          f"a positive integer, got {k!r}")
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
