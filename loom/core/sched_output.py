"""What the scheduler hands the workers each step, and what they hand back.

The scheduler's output is a diff: a request is sent in full once (when first scheduled, or
when resumed after preemption); afterwards only what changed. Workers keep persistent
per-request state. These are msgspec Structs so that the multiprocess executor can
broadcast them to every rank without pickle.
"""

from __future__ import annotations

import msgspec

from loom.engine.protocol import Logprobs
from loom.lora.request import LoRARequest
from loom.pooling_params import PoolingParams
from loom.sampling_params import SamplingParams


class NewRequestData(msgspec.Struct, array_like=True, omit_defaults=True):
    req_id: str
    token_ids: list[int]
    """Every token known so far: the prompt, then any outputs (a resumed request)."""
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    """Tokens whose KV is already in the cache (a prefix-cache hit)."""
    eos_token_id: int | None = None
    pooling_params: PoolingParams | None = None
    lora_request: LoRARequest | None = None


class CachedRequestData(msgspec.Struct, array_like=True, omit_defaults=True):
    req_id: str
    new_block_ids: list[int]
    """Blocks appended to the request's block table this step."""
    num_computed_tokens: int
    """Sampled tokens are not sent: each worker keeps those of its own steps (on the device
    for the next input, on the host once the step's output is read back)."""
    spec_token_ids: list[int] = []
    """Speculative decoding: draft tokens after the request's last one, scheduled (and
    verified) with it this step."""


class SchedulerOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    new_reqs: list[NewRequestData] = []
    cached_reqs: list[CachedRequestData] = []
    num_scheduled_tokens: dict[str, int] = {}
    """Tokens to compute this step per request; batch order is new_reqs then cached_reqs."""
    total_num_scheduled_tokens: int = 0
    finished_req_ids: list[str] = []
    """Requests finished, aborted or preempted since the last step: workers drop their state."""
    grammar_bitmask: dict[str, bytes] = {}
    """Guided requests sampling this step: allowed next tokens, packed as llguidance does
    (little-endian int32 words, bit i of word j is token 32 * j + i; the tokenizer's vocab)."""

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


class ModelRunnerOutput(msgspec.Struct, array_like=True, omit_defaults=True):
    req_ids: list[str] = []
    sampled_token_ids: list[list[int]] = []
    """Per request in batch order: [] for a prefill chunk that does not reach the end."""
    logprobs: list[Logprobs | None] = []
    prompt_logprobs: dict[str, list[Logprobs]] = {}
    """Prompt logprobs computed this step, per request (a chunk of them under chunked prefill)."""
    pooled: dict[str, list[float]] = {}
    """Pooling requests whose prompt completed this step -> their pooled vector."""
    spec_logprobs: dict[str, list[Logprobs]] = {}
    """Speculative decoding: the logprobs of each token a drafting request output this step
    (for it, in place of its `logprobs` entry)."""
    draft_token_ids: dict[str, list[int]] = {}
    """A draft model's proposals for each request's next step (`loom.worker.drafter`)."""
    lora_errors: dict[int, str] = {}
    """LoRA adapters of this step that could not be loaded (id -> why): their rows ran
    without them (`lora.manager`), so the scheduler ends their requests with the error."""

    def logprobs_of(self, i: int, req_id: str) -> list[Logprobs] | None:
        """The logprobs of each token request i output (a drafting request's may be
        several)."""
        if req_id in self.spec_logprobs:
            return self.spec_logprobs[req_id]
        # The runner leaves the list empty when no request in the batch asked for logprobs.
        if i < len(self.logprobs) and self.logprobs[i] is not None:
            return [self.logprobs[i]]
        return None
