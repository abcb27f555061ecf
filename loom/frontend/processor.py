"""Turn a user's prompt and SamplingParams into a validated `EngineCoreRequest`.

Runs in the API process (no torch): checks here give the caller a ValueError naming the
problem before anything reaches the engine.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from loom.core.structured_output import validate_guided
from loom.engine.protocol import EngineCoreRequest, LoRAInfo, ModelTasks
from loom.frontend.tokenizer import Tokenizer
from loom.lora.adapter import read_adapter
from loom.lora.request import LoRARequest
from loom.pooling_params import PoolingParams
from loom.sampling_params import SamplingParams
from loom.models.arch import is_encoder
from loom.tasks import check_dimensions

POOLING_PLACEHOLDER = SamplingParams(max_tokens=1, temperature=0.0)
"""The sampling params a pooling request carries: it ends before it would ever sample."""

PromptType = str | list[int]


def check_num_logprobs(field: str, value: int | None, max_logprobs: int) -> None:
    """vLLM's --max-logprobs: a ValueError naming the field that asks for more."""
    if value is not None and value > max_logprobs:
        raise ValueError(f"{field}: {value} is more than the engine's max_logprobs "
                         f"({max_logprobs}); raise it (--max-logprobs, LLM(max_logprobs=...); "
                         "-1: the whole vocabulary)")


def truncate_prompt(token_ids: list[int], keep: int | None, max_model_len: int,
                    frame: tuple[list[int], list[int]] = ([], [])) -> list[int]:
    """vLLM's truncate_prompt_tokens: the last `keep` tokens (-1: max_model_len of them).
    frame: the special tokens the tokenizer puts before and after a text (`Tokenizer.
    special_frame`); a prompt inside them keeps them, its text cut from the left, as the
    tokenizer's own (left) truncation cuts it, so that an encoder keeps its [CLS]."""
    if keep is None:
        return token_ids
    keep = max_model_len if keep == -1 else keep
    n = len(token_ids)
    if n <= keep:
        return token_ids
    before, after = frame
    p, s = len(before), len(after)
    if (p or s) and keep > p + s and token_ids[:p] == before and token_ids[n - s:] == after:
        return token_ids[:p] + token_ids[p:n - s][-(keep - p - s):] + token_ids[n - s:]
    return token_ids[-keep:]


class Processor:
    def __init__(self, tokenizer: Tokenizer | None, max_model_len: int, vocab_size: int,
                 eos_token_id: int | None, max_logprobs: int | None = None,
                 lora: LoRAInfo | None = None, scheduling_policy: str = "fcfs",
                 tasks: ModelTasks | None = None,
                 logits_processors: Sequence[type] = ()) -> None:
        """max_logprobs: resolved (never -1); None: as many as the vocabulary holds.
        tasks: the model's (`loom.tasks`), which an embedding's dimensions are checked by.
        lora: the engine's LoRA limits; None: requests may not name an adapter.
        scheduling_policy: the engine's; under "fcfs" every request's priority is 0.
        logits_processors: the engine's custom processor classes, whose validate_params
        checks each request's params."""
        self.lora = lora
        self.logits_processors = tuple(logits_processors)
        self.tasks = tasks
        self.scheduling_policy = scheduling_policy
        self._lora_paths: dict[int, str] = {}
        """Adapters checked so far: lora_int_id -> its path (an id names one adapter)."""
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.max_logprobs = vocab_size if max_logprobs is None else max_logprobs
        self.eos_token_id = tokenizer.eos_token_id if tokenizer is not None else eos_token_id
        # generation_config.json may list more ids that end generation (Llama 3.1 Instruct:
        # <|eom_id|> and <|eot_id|> beside <|end_of_text|>). As vLLM does, they stop a
        # request as stop_token_ids do, unless it ignores EOS.
        self.extra_eos_ids = (sorted(tokenizer.eos_token_ids - {self.eos_token_id})
                              if tokenizer is not None else [])

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("prompt: a text prompt needs a tokenizer (skip_tokenizer_init "
                                 "was set); pass token ids")
            return prompt, self.tokenizer.encode(prompt)
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                            for t in prompt):
            return None, list(prompt)
        raise ValueError("prompt: must be a string or a list of token ids")

    def _check_tokens(self, token_ids: list[int], field: str, room_for_output: bool) -> None:
        n = len(token_ids)
        if n == 0:
            raise ValueError(f"{field}: must not be empty")
        if n > self.max_model_len:
            raise ValueError(f"{field}: {n} tokens is longer than max_model_len "
                             f"({self.max_model_len})")
        if room_for_output and n == self.max_model_len:
            raise ValueError(f"{field}: {n} tokens is too long for max_model_len "
                             f"({self.max_model_len}): no room for output")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"{field}: token id(s) {bad[:5]} outside the vocabulary "
                             f"(0..{self.vocab_size - 1})")

    def _whole_vocabulary(self, params: SamplingParams) -> SamplingParams:
        """vLLM's logprobs / prompt_logprobs -1: as many as the vocabulary holds."""
        every = {name: self.vocab_size for name in ("logprobs", "prompt_logprobs")
                 if getattr(params, name) == -1}
        if every and self.vocab_size > self.max_logprobs:  # the bound in the caller's terms
            raise ValueError(f"{next(iter(every))}: -1 asks for the whole vocabulary "
                             f"({self.vocab_size} tokens), more than the engine's max_logprobs "
                             f"({self.max_logprobs}); start it with --max-logprobs -1 "
                             "(LLM(max_logprobs=-1))")
        return params.clone(**every) if every else params

    def _check_logprobs(self, params: SamplingParams) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.vocab_size:
                raise ValueError(f"{name}: {value} is more than the vocabulary's "
                                 f"{self.vocab_size} tokens")
            check_num_logprobs(name, value, self.max_logprobs)

    def check_lora(self, request: LoRARequest) -> None:
        """A ValueError unless the engine takes LoRA adapters and this one fits the model;
        each adapter's files are read once (the worker loads them again)."""
        if not isinstance(request, LoRARequest):
            raise ValueError(f"lora_request: must be a LoRARequest, got {type(request).__name__}")
        if self.lora is None:
            raise ValueError(f"lora_request {request.lora_name!r}: LoRA is not enabled; start "
                             "the engine with --enable-lora (LLM(enable_lora=True))")
        known = self._lora_paths.get(request.lora_int_id)
        if known is None:
            read_adapter(request, self.lora.targets, self.lora.max_lora_rank)
            self._lora_paths[request.lora_int_id] = request.lora_path
        elif known != request.lora_path:
            raise ValueError(f"lora_request {request.lora_name!r}: lora_int_id "
                             f"{request.lora_int_id} already names the adapter at {known}")

    def process(self, request_id: str, prompt_token_ids: list[int],
                params: SamplingParams, cache_salt: str | None = None,
                lora_request: LoRARequest | None = None, priority: int = 0,
                text: bool = False) -> EngineCoreRequest:
        """cache_salt: vLLM's; only requests with the same salt share cached prefixes.
        lora_request: the adapter it runs with (None: the base model).
        priority: vLLM's; lower values are served first (priority scheduling only).
        text: the ids are a text prompt's (`truncate` keeps its special tokens)."""
        self.check_priority(priority)
        if cache_salt is not None and not (isinstance(cache_salt, str) and cache_salt):
            raise ValueError("cache_salt: must be a non-empty string")
        if lora_request is not None:
            self.check_lora(lora_request)
        prompt_token_ids = self.truncate(prompt_token_ids, params.truncate_prompt_tokens, text)
        self._check_tokens(prompt_token_ids, "prompt", room_for_output=True)
        n = len(prompt_token_ids)
        params = self._whole_vocabulary(params)
        self._check_logprobs(params)
        if params.bad_words:
            # The engine gets token sequences only (and converting twice adds nothing).
            params = params.clone(bad_words=[], bad_words_token_ids=params.bad_words_token_ids
                                  + self._bad_words_ids(params.bad_words))
        for name in ("logit_bias", "allowed_token_ids", "bad_words_token_ids"):
            ids = getattr(params, name)
            if name == "bad_words_token_ids":
                ids = [t for seq in ids for t in seq]
            bad = [t for t in ids or () if t >= self.vocab_size]
            if bad:
                raise ValueError(f"{name}: token id(s) {bad[:5]} outside the vocabulary "
                                 f"(0..{self.vocab_size - 1})")
        if params.guided_decoding is not None:
            validate_guided(params.guided_decoding)
        for cls in self.logits_processors:
            cls.validate_params(params)
        if params.max_tokens is None:
            params = params.clone(max_tokens=self.max_model_len - n)
        extra = [t for t in self.extra_eos_ids if t not in params.stop_token_ids]
        if extra and not params.ignore_eos:
            params = params.clone(stop_token_ids=params.stop_token_ids + extra)
        return EngineCoreRequest(request_id, list(prompt_token_ids), params, time.time(),
                                 self.eos_token_id, cache_salt=cache_salt,
                                 lora_request=lora_request, priority=priority)

    def check_priority(self, priority: int) -> None:
        """vLLM's rule: only the priority policy takes a priority other than 0."""
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority: must be an integer, got {priority!r}")
        if not -(2**63) <= priority < 2**63:  # what msgspec carries to the engine
            raise ValueError(f"priority: must fit in 64 bits, got {priority}")
        if priority != 0 and self.scheduling_policy != "priority":
            raise ValueError(f"priority: Got priority {priority} but Priority scheduling is not "
                             "enabled; start the engine with --scheduling-policy priority "
                             "(LLM(scheduling_policy=\"priority\"))")

    def _bad_words_ids(self, words: list[str]) -> list[list[int]]:
        """Each word as it starts the text and as it follows a space (vLLM's rule: the
        second only where it is a different word token of the same length)."""
        if self.tokenizer is None:
            raise ValueError("bad_words: needs a tokenizer; give bad_words_token_ids")
        out = []
        for word in words:
            alone = self.tokenizer.encode(word.lstrip(), add_special_tokens=False)
            spaced = self.tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            out.append(alone)
            if spaced[0] != alone[0] and len(spaced) == len(alone):
                out.append(spaced)
        return out

    def truncate(self, token_ids: list[int], keep: int | None, text: bool) -> list[int]:
        """truncate_prompt_tokens applied to a prompt's ids. A text prompt (text) keeps the
        special tokens the tokenizer put around it (Llama 3's <|begin_of_text|>), as vLLM's
        truncation through the tokenizer does; token ids are cut plainly, except that an
        encoder's keep its [CLS] ... [SEP]."""
        if text and self.tokenizer is not None:
            frame = self.tokenizer.special_frame
        else:
            frame = self._encoder_frame()
        return truncate_prompt(token_ids, keep, self.max_model_len, frame)

    def _encoder_frame(self) -> tuple[list[int], list[int]]:
        """An encoder's tokenizer frame, which truncation keeps (its [CLS] is what it pools);
        a decoder's prompts are cut plainly, as vLLM cuts token ids."""
        if self.tokenizer is None or self.tasks is None or not is_encoder(
                self.tasks.architecture):
            return [], []
        return self.tokenizer.special_frame

    def process_pooling(self, request_id: str, prompt_token_ids: list[int],
                        params: PoolingParams, text: bool = False) -> EngineCoreRequest:
        """An embedding request: pooling instead of sampling, so the input may fill the
        whole context (nothing is generated after it). text: as `process`'s."""
        if not isinstance(params, PoolingParams):
            raise ValueError(f"pooling_params: expected PoolingParams, got "
                             f"{type(params).__name__}")
        if self.tasks is not None:
            check_dimensions(params.dimensions, self.tasks)
        prompt_token_ids = self.truncate(prompt_token_ids, params.truncate_prompt_tokens, text)
        self._check_tokens(prompt_token_ids, "input", room_for_output=False)
        return EngineCoreRequest(request_id, list(prompt_token_ids), POOLING_PLACEHOLDER,
                                 time.time(), self.eos_token_id, pooling_params=params)
