"""A request as the engine core sees it: tokens, progress, and why it ended."""

from __future__ import annotations

import enum
import time
from typing import TYPE_CHECKING

from loom.engine.protocol import EngineCoreRequest, FinishReason
from loom.lora.request import LoRARequest
from loom.pooling_params import PoolingParams
from loom.sampling_params import SamplingParams

if TYPE_CHECKING:
    from loom.core.structured_output import GrammarMatcher


class RequestStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_ERROR = enum.auto()

    @property
    def finished(self) -> bool:
        return self in _FINISH_REASONS

    @property
    def finish_reason(self) -> FinishReason | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


class Request:
    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 eos_token_id: int | None = None, arrival_time: float = 0.0,
                 pooling_params: PoolingParams | None = None,
                 cache_salt: str | None = None, lora_request: LoRARequest | None = None,
                 priority: int = 0) -> None:
        self.request_id = request_id
        self.priority = priority
        """vLLM's: under the priority scheduling policy, lower values are served first."""
        self.cache_salt = cache_salt
        """Mixed into the first block's hash: only the same salt shares cached prefixes."""
        self.lora_request = lora_request
        """Its LoRA adapter (None: the base model); mixed into the hash as the salt is."""
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.arrival_time = arrival_time
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        """Tokens whose KV is in the cache (computed or a prefix-cache hit), counting those
        of steps still in flight."""
        self.num_output_placeholders = 0
        """Tokens sampled by steps in flight whose values are not yet known here (async
        scheduling): the next decode can be scheduled before they arrive."""
        self.num_cached_tokens = -1
        """Prefix-cache hit length at first scheduling (-1 before)."""
        self.spec_token_ids: list[int] = []
        """Draft tokens scheduled in the step in flight (speculative decoding)."""
        self.status = RequestStatus.WAITING
        self.stop_reason: int | None = None
        self.max_tokens = sampling_params.max_tokens
        self.grammar: GrammarMatcher | None = None
        """Guided decoding: where the output stands in its grammar (set by the engine core)."""
        self.pooling_params = pooling_params
        """Set for an embedding request: it ends when its prompt is computed."""
        self.added_at = time.monotonic()
        self.queue_time_s: float | None = None
        """Set when first scheduled; reported once, on the first output."""
        self.scheduled_at: float | None = None
        """When first scheduled (monotonic); the prefill time runs from here to the first
        token, reported once, with it (`take_prefill_time`)."""

    @classmethod
    def from_engine_core_request(cls, req: EngineCoreRequest) -> Request:
        return cls(req.request_id, req.prompt_token_ids, req.sampling_params,
                   req.eos_token_id, req.arrival_time, req.pooling_params, req.cache_salt,
                   req.lora_request, req.priority)

    def take_queue_time(self) -> float | None:
        """The queue time, the first time it is asked for after scheduling; then None."""
        value, self.queue_time_s = self.queue_time_s, None
        return value

    def take_prefill_time(self, new_token_ids: list[int]) -> float | None:
        """Seconds from first scheduling to the first token, when new_token_ids are the
        request's first (vLLM's prefill time: every prompt chunk, and any step it waited
        behind, counted); else None."""
        if (self.scheduled_at is None or not new_token_ids
                or self.num_output_tokens != len(new_token_ids)):
            return None
        value, self.scheduled_at = time.monotonic() - self.scheduled_at, None
        return value

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_tokens_with_placeholders(self) -> int:
        return len(self.all_token_ids) + self.num_output_placeholders

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    @property
    def skips_prefix_cache(self) -> bool:
        """Prompt logprobs and mean/cls pooling need every prompt row computed."""
        if self.sampling_params.prompt_logprobs is not None:
            return True
        return self.pooling_params is not None and self.pooling_params.needs_every_prompt_row

    @property
    def is_finished(self) -> bool:
        return self.status.finished
