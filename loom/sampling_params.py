"""`SamplingParams`: what a request asks of generation, validated on construction.

A msgspec Struct, so that it crosses the API -> engine ZeroMQ boundary unchanged.
"""

from __future__ import annotations

from typing import Any

import msgspec

from loom.config_checks import check_bools

_GREEDY_EPS = 1e-5
_GUIDED_KINDS = ("json", "regex", "choice", "grammar", "json_object")


class GuidedDecodingParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    """Structured output: exactly one constraint on the generated text (vLLM's fields).

    Set-ness is checked here; whether a schema, regex or grammar compiles is checked by the
    frontend (`loom.core.structured_output.validate_guided`), which needs llguidance.
    """
    json: str | dict[str, Any] | None = None
    """A JSON schema, as a JSON string or an object; a pydantic model class is taken as its
    `model_json_schema()`."""
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    """A Lark (or GBNF) grammar, as llguidance accepts it."""
    json_object: bool = False
    """Any JSON object."""

    def __post_init__(self) -> None:
        set_kinds = self.kinds
        if len(set_kinds) != 1:
            got = ", ".join(set_kinds) or "none"
            raise ValueError(f"guided_decoding: set exactly one of {', '.join(_GUIDED_KINDS)}; "
                             f"got {got}")
        if self.choice is not None and not (self.choice
                                            and all(isinstance(c, str) for c in self.choice)):
            raise ValueError("guided_decoding.choice: must be a non-empty list of strings")
        if self.json is not None and not isinstance(self.json, (str, dict)):
            schema = getattr(self.json, "model_json_schema", None)  # a pydantic model class
            if not callable(schema):
                raise ValueError("guided_decoding.json: must be a JSON schema (str or dict) or "
                                 f"a pydantic model class, got {type(self.json).__name__}")
            self.json = schema()

    @property
    def kinds(self) -> list[str]:
        return [k for k in _GUIDED_KINDS
                if (getattr(self, k) is not None and getattr(self, k) is not False)]


StructuredOutputsParams = GuidedDecodingParams
"""vLLM's newer name for the same parameters."""


def check_truncation(keep: Any) -> None:
    """truncate_prompt_tokens: None, -1 or a positive count (sampling and pooling alike)."""
    if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool)
                             or not (keep == -1 or keep >= 1)):
        raise ValueError(f"truncate_prompt_tokens: must be -1 or a positive integer, got "
                         f"{keep!r}")


class SamplingParams(msgspec.Struct, omit_defaults=True, kw_only=True):
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 or -1: no top-k."""
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    """None: up to the model's context length."""
    min_tokens: int = 0
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    logprobs: int | None = None
    """Number of top logprobs per sampled token (0: only the sampled token's; -1, vLLM's:
    the whole vocabulary's, within the engine's max_logprobs)."""
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    guided_decoding: GuidedDecodingParams | None = None
    """Structured output; None: unconstrained."""
    structured_outputs: GuidedDecodingParams | None = None
    """vLLM's newer name for guided_decoding: either may be given, and both then hold it."""
    logit_bias: dict[int, float] | None = None
    """OpenAI's: token id -> a bias in [-100, 100] added to its logit before sampling."""
    allowed_token_ids: list[int] | None = None
    """vLLM's: only these tokens may be sampled."""
    truncate_prompt_tokens: int | None = None
    """vLLM's: keep only the prompt's last k tokens (-1: as many as max_model_len)."""
    bad_words: list[str] = []
    """vLLM's: words never generated, at the start of the text or after a space."""
    bad_words_token_ids: list[list[int]] = []
    """bad_words as token sequences (the frontend fills it from bad_words; may be given)."""
    extra_args: dict[str, Any] | None = None
    """vLLM's: arguments for custom logits processors (`loom.logits_processor`), which read
    them from a request's params; `vllm_xargs` in an HTTP request. Plain values only (they
    cross to the engine's process)."""

    def __post_init__(self) -> None:
        # As vLLM takes them: None for none, one string, or any sequence.
        if self.stop is None:
            self.stop = []
        elif isinstance(self.stop, str):
            self.stop = [self.stop]
        elif isinstance(self.stop, tuple):
            self.stop = list(self.stop)
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        elif isinstance(self.stop_token_ids, tuple):
            self.stop_token_ids = list(self.stop_token_ids)
        self._check_types()
        if self.top_k == -1:
            self.top_k = 0
        self._validate()

    def _check_types(self) -> None:
        """A Struct built in Python is not type-checked by msgspec: a float seed or a scalar
        stop_token_ids would otherwise fail inside the engine, mid-step."""
        def is_int(v: Any) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)

        def is_number(v: Any) -> bool:
            return isinstance(v, int | float) and not isinstance(v, bool)

        for name in ("n", "top_k", "min_tokens"):
            if not is_int(getattr(self, name)):
                raise ValueError(f"{name}: must be an integer, got {getattr(self, name)!r}")
        check_truncation(self.truncate_prompt_tokens)
        for name in ("seed", "max_tokens", "logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not is_int(value):
                raise ValueError(f"{name}: must be an integer or None, got {value!r}")
        for name in ("temperature", "top_p", "min_p", "repetition_penalty",
                     "presence_penalty", "frequency_penalty"):
            if not is_number(getattr(self, name)):
                raise ValueError(f"{name}: must be a number, got {getattr(self, name)!r}")
        check_bools({name: getattr(self, name) for name in
                     ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens")})
        if not isinstance(self.stop, list):
            raise ValueError(f"stop: must be a string or a list of strings, got {self.stop!r}")
        if not (isinstance(self.stop_token_ids, list)
                and all(is_int(t) and t >= 0 for t in self.stop_token_ids)):
            raise ValueError(f"stop_token_ids: must be a list of token ids (non-negative "
                             f"integers), got {self.stop_token_ids!r}")
        self._check_token_maps(is_int, is_number)
        if self.extra_args is not None and not (isinstance(self.extra_args, dict) and all(
                isinstance(k, str) for k in self.extra_args)):
            raise ValueError(f"extra_args: must be a dict with string keys, got "
                             f"{self.extra_args!r}")
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ValueError(f"seed: must fit in 64 bits, got {self.seed}")
        if self.guided_decoding is None:
            self.guided_decoding = self.structured_outputs
        elif (self.structured_outputs is not None
              and self.structured_outputs != self.guided_decoding):
            raise ValueError("structured_outputs: give it or guided_decoding, not both")
        self.structured_outputs = self.guided_decoding
        if not (self.guided_decoding is None
                or isinstance(self.guided_decoding, GuidedDecodingParams)):
            raise ValueError("guided_decoding: must be a GuidedDecodingParams, got "
                             f"{type(self.guided_decoding).__name__}")

    def _check_token_maps(self, is_int, is_number) -> None:
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict) or not all(
                    is_int(t) and t >= 0 and is_number(b) and -100 <= b <= 100
                    for t, b in self.logit_bias.items()):
                raise ValueError("logit_bias: must map token ids (non-negative integers) to "
                                 f"biases in [-100, 100], got {self.logit_bias!r}")
        for name in ("bad_words", "bad_words_token_ids"):
            if getattr(self, name) is None:
                setattr(self, name, [])
        if not (isinstance(self.bad_words, list)
                and all(isinstance(w, str) and w.strip() for w in self.bad_words)):
            raise ValueError(f"bad_words: must be a list of non-blank strings, got "
                             f"{self.bad_words!r}")
        if not (isinstance(self.bad_words_token_ids, list) and all(
                isinstance(s, list) and s and all(is_int(t) and t >= 0 for t in s)
                for s in self.bad_words_token_ids)):
            raise ValueError("bad_words_token_ids: must be a list of non-empty token id "
                             f"lists, got {self.bad_words_token_ids!r}")
        if self.allowed_token_ids is not None:
            if isinstance(self.allowed_token_ids, tuple):
                self.allowed_token_ids = list(self.allowed_token_ids)
            if not (isinstance(self.allowed_token_ids, list) and self.allowed_token_ids
                    and all(is_int(t) and t >= 0 for t in self.allowed_token_ids)):
                raise ValueError("allowed_token_ids: must be a non-empty list of token ids, "
                                 f"got {self.allowed_token_ids!r}")

    def _validate(self) -> None:
        checks = [
            (self.n >= 1, "n", f"must be at least 1, got {self.n}"),
            (self.temperature >= 0.0, "temperature", f"must be non-negative, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, "top_k", f"must be -1, 0 or positive, got {self.top_k}"),
            (0.0 <= self.min_p <= 1.0, "min_p", f"must be in [0, 1], got {self.min_p}"),
            (self.repetition_penalty > 0.0, "repetition_penalty",
             f"must be positive, got {self.repetition_penalty}"),
            (-2.0 <= self.presence_penalty <= 2.0, "presence_penalty",
             f"must be in [-2, 2], got {self.presence_penalty}"),
            (-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty",
             f"must be in [-2, 2], got {self.frequency_penalty}"),
            (self.max_tokens is None or self.max_tokens >= 1, "max_tokens",
             f"must be at least 1, got {self.max_tokens}"),
            (self.min_tokens >= 0, "min_tokens", f"must be non-negative, got {self.min_tokens}"),
            (self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
             f"must not exceed max_tokens ({self.max_tokens}), got {self.min_tokens}"),
            (self.logprobs is None or self.logprobs >= -1, "logprobs",
             f"must be non-negative (or -1: the whole vocabulary), got {self.logprobs}"),
            (self.prompt_logprobs is None or self.prompt_logprobs >= -1, "prompt_logprobs",
             f"must be non-negative (or -1: the whole vocabulary), got "
             f"{self.prompt_logprobs}"),
            (all(isinstance(s, str) and s for s in self.stop), "stop",
             "must be non-empty strings"),
        ]
        for ok, name, msg in checks:
            if not ok:
                raise ValueError(f"{name}: {msg}")

    @property
    def uses_penalties(self) -> bool:
        """Whether sampling reads the token history (repetition/presence/frequency)."""
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def shapes_logits(self) -> bool:
        """Whether sampling changes the logits beyond temperature and the filters."""
        return (self.uses_penalties or bool(self.logit_bias) or bool(self.bad_words_token_ids)
                or self.allowed_token_ids is not None)

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    def clone(self, **changes) -> SamplingParams:
        for name in ("guided_decoding", "structured_outputs"):  # the two names stay one
            if name in changes:
                changes.update(guided_decoding=changes[name], structured_outputs=changes[name])
        return msgspec.structs.replace(self, **changes)
