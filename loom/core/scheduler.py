"""Continuous batching with chunked prefill under a per-step token budget.

Each step, running requests are served first (a decode token, or the next chunk of a
prompt), then waiting requests are admitted in queue order (request_queue.py: fcfs or by
priority) while tokens, sequence slots and KV blocks last. When blocks run out, the last
running request in that order is preempted: its blocks are freed and it is recomputed later.

Async scheduling: the engine may call schedule() again while the last step is still in
flight. A request that samples in that step holds an output placeholder; its next decode
is scheduled at once (the workers feed it the token they sampled) when nothing about that
step depends on the token's value on the host (`_may_run_ahead`), and otherwise waits for
update_from_output. A request with a placeholder is never preempted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from loom.config import CacheConfig, SchedulerConfig
from loom.core.kv_cache_manager import KVCacheManager, cdiv
from loom.core.lora_admission import LoRAAdmission
from loom.core.request import Request, RequestStatus
from loom.core.request_outputs import pooling_output, token_output
from loom.core.request_queue import make_request_queue
from loom.core.spec_decode import SpecDecoder
from loom.core.stop_checks import check_grammar, check_stop
from loom.core.sched_output import (CachedRequestData, ModelRunnerOutput, NewRequestData,
                                    SchedulerOutput)
from loom.core.structured_output import grammar_bitmasks
from loom.engine.protocol import EngineCoreOutput, SchedulerStats
from loom.speculative_config import SpeculativeConfig


@dataclass
class _Step:
    """What one schedule() call has decided so far."""
    budget: int
    new_reqs: list[NewRequestData] = field(default_factory=list)
    cached_reqs: list[CachedRequestData] = field(default_factory=list)
    new_tokens: dict[str, int] = field(default_factory=dict)
    cached_tokens: dict[str, int] = field(default_factory=dict)
    preempted: bool = False


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig,
                 num_blocks: int, max_model_len: int,
                 speculative: SpeculativeConfig | None = None,
                 max_loras: int | None = None, whole_prompts: bool = False) -> None:
        """whole_prompts: a prompt is never split over steps (an encoder's attends both
        ways); one waits for a step with room for all of it."""
        # The engine passes the limits its workers chose; a bare config takes the CPU's.
        self.config = scheduler_config.resolved(None, 0)
        self.max_model_len = max_model_len
        self.block_size = cache_config.block_size
        self.num_blocks = num_blocks
        self.kv_cache_manager = KVCacheManager(num_blocks, cache_config.block_size,
                                               cache_config.enable_prefix_caching,
                                               cache_config.prefix_caching_hash_algo)
        self.requests: dict[str, Request] = {}
        self.waiting = make_request_queue(scheduler_config.scheduling_policy)
        self.running: list[Request] = []
        self.finished_req_ids: list[str] = []
        """Finished, aborted or preempted since the last schedule(): workers drop them."""
        self.spec = SpecDecoder(speculative, max_model_len) if speculative is not None else None
        self._verifying = False
        """A step in flight verifies some request's drafts (set by schedule())."""
        self.loras = LoRAAdmission(max_loras)
        self.whole_prompts = whole_prompts
        self._num_preemptions = 0
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0

    # -- requests in and out -------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        self._validate(request)
        self.requests[request.request_id] = request
        self.waiting.add(request)

    def abort_requests(self, request_ids: Iterable[str],
                       error: str | None = None) -> list[EngineCoreOutput]:
        outputs = []
        for rid in request_ids:
            request = self.requests.pop(rid, None)
            if request is None:
                continue  # unknown, or already finished
            if request.status == RequestStatus.RUNNING:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            request.status = RequestStatus.FINISHED_ABORTED
            if error:  # what it computed may not be what its prefix-cache hashes say
                request.status = RequestStatus.FINISHED_ERROR
                self.kv_cache_manager.forget_prefix(request)
            self._free(request)
            self.finished_req_ids.append(rid)
            outputs.append(EngineCoreOutput(rid, [], finish_reason=request.status.finish_reason,
                                            num_cached_tokens=max(0, request.num_cached_tokens),
                                            error=error))
        return outputs

    def has_request(self, request_id: str) -> bool:
        """Whether the id is waiting or running (finished ones are forgotten)."""
        return request_id in self.requests

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def get_num_unfinished_requests(self) -> int:
        return len(self.requests)

    def _validate(self, request: Request) -> None:
        """Reject what could never be scheduled, rather than let it block the queue."""
        rid, n = request.request_id, request.num_prompt_tokens
        if rid in self.requests:
            raise ValueError(f"request {rid!r}: id already in use")
        if n == 0:
            raise ValueError(f"request {rid!r}: empty prompt")
        if n > self.max_model_len:
            raise ValueError(f"request {rid!r}: prompt of {n} tokens exceeds "
                             f"max_model_len {self.max_model_len}")
        # Its longest KV: every token but the last sampled one is computed.
        max_tokens = self.max_model_len if request.max_tokens is None else request.max_tokens
        longest = min(n + max_tokens - 1, self.max_model_len)
        if cdiv(longest, self.block_size) > self.num_blocks:
            raise ValueError(f"request {rid!r}: needs up to {longest} tokens of KV cache, "
                             f"more than the {self.num_blocks * self.block_size} it holds")

    # -- schedule ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        waits = self.spec is not None and self.spec.waits_for_step(self.running)
        step = _Step(budget=0 if waits else self.config.max_num_batched_tokens)
        # While any step in flight verifies drafts, nothing runs ahead: the batch waits
        # for it whole, rather than splitting into halves that each read every weight.
        self._verifying = self.spec is not None and any(r.spec_token_ids for r in self.running)
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_waiting(step)
        # Batch order: new requests, then running ones.
        num_scheduled = {**step.new_tokens, **step.cached_tokens}
        for rid, n in num_scheduled.items():
            request = self.requests[rid]
            request.num_computed_tokens += n
            if (request.pooling_params is None
                    and request.num_computed_tokens >= request.num_tokens_with_placeholders):
                request.num_output_placeholders += 1  # this step samples its next token
        output = SchedulerOutput(new_reqs=step.new_reqs, cached_reqs=step.cached_reqs,
                                 num_scheduled_tokens=num_scheduled,
                                 total_num_scheduled_tokens=sum(num_scheduled.values()),
                                 finished_req_ids=self.finished_req_ids,
                                 grammar_bitmask=grammar_bitmasks(
                                     self.requests[rid] for rid in num_scheduled))
        self.finished_req_ids = []
        return output

    def _schedule_running(self, step: _Step) -> None:
        i = 0
        while i < len(self.running) and step.budget > 0:
            request = self.running[i]
            num_new = min(request.num_tokens_with_placeholders - request.num_computed_tokens,
                          step.budget)
            if num_new <= 0 or (request.num_output_placeholders
                                and not self._may_run_ahead(request)):
                i += 1  # nothing to compute until update_from_output appends
                continue
            drafts = self.spec.drafts(request, num_new, step.budget) if self.spec else []
            extra = len(drafts) + self._lookahead(
                request, request.num_computed_tokens + num_new + len(drafts))
            new_block_ids = (self.kv_cache_manager.allocate_slots(request, num_new + extra)
                             if extra else None)
            if new_block_ids is None:  # no drafts, or no room for them: one token
                drafts, new_block_ids = [], self._allocate_or_preempt(request, num_new, step)
            if new_block_ids is None:
                return  # it preempted itself (the last one running), or must wait
            rid = request.request_id
            request.spec_token_ids, num_new = drafts, num_new + len(drafts)
            # Workers know sampled tokens from their own steps: only block ids travel.
            step.cached_reqs.append(
                CachedRequestData(rid, new_block_ids, request.num_computed_tokens, drafts))
            step.cached_tokens[rid] = num_new
            step.budget -= num_new
            i += 1

    def _lookahead(self, request: Request, end: int) -> int:
        return self.spec.lookahead_slots(request, end) if self.spec is not None else 0

    def _allocate_or_preempt(self, request: Request, num_new: int,
                             step: _Step) -> list[int] | None:
        """Preempt from the back of the running list (its lowest rank) until the request's
        blocks fit. Requests before it were scheduled this step and rank above: never victims."""
        while True:
            new_block_ids = self.kv_cache_manager.allocate_slots(request, num_new)
            if new_block_ids is not None:
                return new_block_ids
            step.preempted = True
            if self.running[-1].num_output_placeholders:
                # Its last step is still in flight: preempt nothing now, retry after the update.
                return None
            victim = self.running.pop()
            self._preempt(victim)
            if victim is request:
                return None

    def _may_run_ahead(self, request: Request) -> bool:
        """Whether a request whose sampled token is still in flight can be scheduled again:
        its next step must not depend on that token's value on the host, and the token
        must not be able to end it. (Sampling that reads the request's outputs, such as
        penalties or custom logits processors, has the worker read its tokens in flight
        back first: `SampledSteps.catch_up`.)"""
        if not self.config.async_scheduling or request.grammar is not None:
            return False
        if self._verifying or (self.spec is not None and not self.spec.runs_ahead):
            return False  # (its own step in flight may add an unknown number of tokens)
        p = request.sampling_params
        if self.spec is not None:
            # Drafts made running ahead guess at tokens in flight; seeded draws follow
            # drafts; and the worker reads back early a step's first token only.
            masks_stops = bool(p.stop_token_ids) or (request.eos_token_id is not None
                                                     and not p.ignore_eos)
            if (p.uses_penalties or p.bad_words_token_ids or (p.seed is not None and not p.greedy)
                    or (request.num_output_tokens < p.min_tokens and masks_stops)):
                return False
        num_outputs = request.num_output_tokens + request.num_output_placeholders
        if request.max_tokens is not None and num_outputs >= request.max_tokens:
            return False
        return request.num_tokens_with_placeholders < self.max_model_len

    def _preempt(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        # fcfs: in front, so it resumes before anything newer; priority: in its rank's place.
        self.waiting.prepend(request)
        self.finished_req_ids.append(request.request_id)
        self._num_preemptions += 1

    def _schedule_waiting(self, step: _Step) -> None:
        self.loras.begin(self.running)
        passed_over: list[Request] = []  # their adapter would be one too many
        reserved = None  # blocks the running requests may still need to decode (lazily)
        while (self.waiting and step.budget > 0
               and len(self.running) < self.config.max_num_seqs):
            request = self.waiting.peek()
            if not self.loras.admits(request):
                passed_over.append(self.waiting.pop())
                continue
            hit_blocks, num_hit = self.kv_cache_manager.get_computed_blocks(request)
            if self.config.kv_headroom_tokens and self.running:  # alone: always admitted
                if reserved is None:
                    reserved = sum(self._growth_blocks(r) for r in self.running)
                growth = cdiv(self._target_tokens(request), self.block_size) - len(hit_blocks)
                if growth + reserved > self.kv_cache_manager.num_free_blocks:
                    break  # it waits for decodes to finish rather than preempt them later
            num_new = min(request.num_tokens - num_hit, step.budget)
            if self.whole_prompts and num_new < request.num_tokens - num_hit:
                break  # the next step has room: nothing behind it jumps the queue
            extra = self._lookahead(request, num_hit + num_new)
            if (self.kv_cache_manager.allocate_slots(request, num_new + extra, hit_blocks) is None
                    and (not extra or self.kv_cache_manager.allocate_slots(
                        request, num_new, hit_blocks) is None)):
                break  # nothing behind it jumps the queue
            self.waiting.pop()
            self._admit(request, num_hit, num_new, step)
            self.loras.admitted(request)
            if reserved is not None:
                reserved += self._growth_blocks(request)
        self.waiting.put_back(passed_over)

    def _target_tokens(self, request: Request) -> int:
        """The KV a request may come to hold: its tokens and those it may yet generate but
        the last (never computed), at most kv_headroom_tokens more, within max_model_len."""
        num_tokens = request.num_tokens_with_placeholders
        room = self.max_model_len - num_tokens + 1
        if request.max_tokens is not None:
            room = min(room, request.max_tokens - request.num_output_tokens
                       - request.num_output_placeholders)
        return num_tokens + max(0, min(room, self.config.kv_headroom_tokens) - 1)

    def _growth_blocks(self, request: Request) -> int:
        """Blocks a request would still allocate to reach _target_tokens."""
        held = self.kv_cache_manager.num_blocks_of(request.request_id)
        return max(0, cdiv(self._target_tokens(request), self.block_size) - held)

    def _admit(self, request: Request, num_hit: int, num_new: int, step: _Step) -> None:
        rid = request.request_id
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_hit
            request.scheduled_at = time.monotonic()
            request.queue_time_s = request.scheduled_at - request.added_at
            self._num_prompt_tokens += request.num_prompt_tokens
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit
        self.waiting.add_running(self.running, request)  # kept in the queue's order
        step.new_reqs.append(NewRequestData(
            req_id=rid, token_ids=list(request.all_token_ids),
            num_prompt_tokens=request.num_prompt_tokens,
            sampling_params=request.sampling_params,
            block_ids=self.kv_cache_manager.get_block_ids(rid), num_computed_tokens=num_hit,
            eos_token_id=request.eos_token_id, pooling_params=request.pooling_params,
            lora_request=request.lora_request))
        step.new_tokens[rid] = num_new
        step.budget -= num_new

    # -- update --------------------------------------------------------------------------

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        outputs = []
        for rid, error in self.loras.failed(runner_output, self.requests).items():
            outputs += self.abort_requests([rid], error)  # rows run without their adapter
        drafted = ({c.req_id: len(c.spec_token_ids) for c in scheduler_output.cached_reqs
                    if c.spec_token_ids} if self.spec is not None else {})
        for i, rid in enumerate(runner_output.req_ids):
            request = self.requests.get(rid)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # aborted after it was scheduled
            if rid in runner_output.pooled:
                outputs.append(pooling_output(request, runner_output.pooled[rid]))
                continue
            if runner_output.sampled_token_ids[i]:
                request.num_output_placeholders -= 1
            if rid in drafted:
                self.spec.on_output(request, drafted[rid], runner_output.sampled_token_ids[i])
            new_token_ids = self._append_tokens(request, runner_output.sampled_token_ids[i])
            if rid in runner_output.draft_token_ids:
                self.spec.proposed(request, runner_output.draft_token_ids[rid])
            prompt_logprobs = runner_output.prompt_logprobs.get(rid)
            if new_token_ids or prompt_logprobs or request.is_finished:
                outputs.append(token_output(request, new_token_ids, prompt_logprobs,
                                            runner_output.logprobs_of(i, rid)))
        if any(r.is_finished for r in self.running):
            self._remove_finished()
        return outputs

    def _append_tokens(self, request: Request, sampled: list[int]) -> list[int]:
        appended = []
        for token_id in sampled:
            request.append_output_token(token_id)
            appended.append(token_id)
            self._num_generation_tokens += 1
            if (check_stop(request, token_id, self.max_model_len)
                    or check_grammar(request, token_id)):
                break
        return appended

    def _remove_finished(self) -> None:
        still_running = []
        for request in self.running:
            if not request.is_finished:
                still_running.append(request)
                continue
            self._free(request)
            del self.requests[request.request_id]
            self.finished_req_ids.append(request.request_id)
        self.running = still_running

    def _free(self, request: Request) -> None:
        """Release a request that has left for good (finished or aborted)."""
        self.kv_cache_manager.free(request)
        if self.spec is not None:
            self.spec.drop(request.request_id)

    # -- stats and utilities -------------------------------------------------------------

    def make_stats(self) -> SchedulerStats:
        queries, hits = self.kv_cache_manager.make_prefix_cache_stats()
        stats = SchedulerStats(
            num_running=len(self.running), num_waiting=len(self.waiting),
            kv_cache_usage=self.kv_cache_manager.usage,
            prefix_cache_queries=queries, prefix_cache_hits=hits,
            num_preemptions=self._num_preemptions, num_prompt_tokens=self._num_prompt_tokens,
            num_generation_tokens=self._num_generation_tokens,
            **(self.spec.take_stats() if self.spec is not None else {}),
            **self.loras.stats(self.running, self.waiting))
        self._num_preemptions = self._num_prompt_tokens = self._num_generation_tokens = 0
        return stats

    def reset_prefix_cache(self) -> bool:
        return self.kv_cache_manager.reset_prefix_cache()

    def preempt_running(self) -> None:
        """Every running request back to waiting, recomputed when it runs again (a sleep
        is about to discard the KV cache)."""
        for request in reversed(self.running):
            self._preempt(request)
        self.running.clear()

