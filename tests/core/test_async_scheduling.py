"""Async scheduling in the scheduler: step N+1 is scheduled before step N's tokens arrive.

The reference is the same scheduler run synchronously (schedule, execute, update): the
pipelined run must emit exactly the same tokens, finish reasons and block accounting.
"""

from __future__ import annotations

from collections import deque

import pytest

from loom.config import CacheConfig, SchedulerConfig
from loom.core.scheduler import Scheduler
from loom.speculative_config import SpeculativeConfig
from tests.core.scheduler_fakes import BS, FakeWorker, add, run_to_end


def make(async_scheduling: bool, num_blocks: int = 64, budget: int = 256,
         max_model_len: int = 256, headroom: int = 512) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget,
                                     async_scheduling=async_scheduling,
                                     kv_headroom_tokens=headroom),
                     CacheConfig(block_size=BS), num_blocks, max_model_len)


def run_pipelined(sched: Scheduler, worker: FakeWorker, depth: int = 2, max_steps: int = 300):
    """What EngineCore.step does under async scheduling: keep up to `depth` steps in flight
    and update from the oldest. Returns the outputs and the ids of requests scheduled while
    a token of theirs was in flight."""
    in_flight, outputs, ran_ahead = deque(), [], set()
    for _ in range(max_steps):
        if not in_flight and not sched.has_unfinished_requests():
            return outputs, ran_ahead
        if not in_flight:
            out = sched.schedule()
            in_flight.append((out, worker.execute(out)))
        while 0 < len(in_flight) < depth and sched.has_unfinished_requests():
            pending = {r.request_id for r in sched.running if r.num_output_placeholders}
            ahead = sched.schedule()
            ran_ahead |= pending & set(ahead.num_scheduled_tokens)
            if not ahead.is_empty or ahead.finished_req_ids:
                in_flight.append((ahead, worker.execute(ahead)))
            if ahead.is_empty:
                break
        out, result = in_flight.popleft()
        outputs += sched.update_from_output(out, result)
    raise AssertionError("requests did not finish")


def by_request(outputs):
    tokens, reasons = {}, {}
    for o in outputs:
        tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        if o.finish_reason is not None:
            reasons[o.request_id] = str(o.finish_reason)
    return tokens, reasons


def scenario(sched: Scheduler) -> None:
    add(sched, "a", [1, 2, 3, 4, 5], max_tokens=6)
    add(sched, "b", [7, 8], max_tokens=20, eos=113)  # by_position samples 113 at 13 tokens
    add(sched, "c", list(range(20)), max_tokens=3)
    add(sched, "pen", [4, 4, 4], max_tokens=4, repetition_penalty=1.3)
    add(sched, "min", [9], max_tokens=5, min_tokens=3)
    add(sched, "seeded", [5, 6], max_tokens=3, temperature=1.0, seed=7)


@pytest.mark.parametrize("depth", [2, 3])
def test_pipelined_run_emits_what_a_synchronous_run_does(depth):
    sync = make(async_scheduling=False)
    scenario(sync)
    expected = by_request(run_to_end(sync, FakeWorker()))
    pipelined = make(async_scheduling=True)
    scenario(pipelined)
    outputs, ahead = run_pipelined(pipelined, FakeWorker(), depth)
    assert by_request(outputs) == expected
    assert expected[1]["b"] == "stop" and len(expected[0]["a"]) == 6
    assert pipelined.kv_cache_manager.num_free_blocks == 64
    # Decodes really ran ahead, all of them: a seeded one's draw needs only its output
    # count, and the worker reads back the tokens in flight of those whose sampling reads
    # their outputs (penalties, min_tokens) before they sample.
    assert ahead == {"a", "b", "c", "pen", "min", "seeded"}
    sync_again = make(async_scheduling=False)
    scenario(sync_again)
    assert run_pipelined(sync_again, FakeWorker())[1] == set()


@pytest.mark.parametrize("params", [dict(repetition_penalty=1.2), dict(presence_penalty=0.5),
                                    dict(min_tokens=4, stop_token_ids=[5]),
                                    dict(bad_words_token_ids=[[4, 5]])])
def test_requests_that_read_their_outputs_run_ahead_without_drafts_only(params):
    sched = make(async_scheduling=True)
    add(sched, "a", [1, 2, 3], max_tokens=8, **params)
    assert sched.schedule().num_scheduled_tokens == {"a": 3}
    assert sched.schedule().num_scheduled_tokens == {"a": 1}
    # With n-gram drafts (which run ahead), the worker could not catch such a request up.
    sched = Scheduler(SchedulerConfig(async_scheduling=True), CacheConfig(block_size=BS), 64,
                      256, SpeculativeConfig(method="ngram", num_speculative_tokens=2,
                                             prompt_lookup_min=1, prompt_lookup_max=2))
    add(sched, "a", [1, 2, 3], max_tokens=8, **params)
    add(sched, "plain", [1, 2, 3], max_tokens=8)
    assert sched.schedule().num_scheduled_tokens == {"a": 3, "plain": 3}
    assert sched.schedule().num_scheduled_tokens == {"plain": 1}


def test_min_tokens_with_nothing_to_mask_runs_ahead():
    # The serving benchmark's ignore_eos requests also set min_tokens: no stop id to mask.
    sched = make(async_scheduling=True)
    add(sched, "a", [1, 2, 3], max_tokens=8, min_tokens=8, ignore_eos=True, eos=2)
    sched.schedule()
    assert sched.schedule().num_scheduled_tokens == {"a": 1}


def test_greedy_decode_runs_ahead_with_a_placeholder_and_stops_at_max_tokens():
    sched = make(async_scheduling=True)
    request = add(sched, "a", [1, 2, 3], max_tokens=2)
    assert sched.schedule().num_scheduled_tokens == {"a": 3}
    ahead = sched.schedule()
    assert ahead.num_scheduled_tokens == {"a": 1}
    assert ahead.cached_reqs[0].num_computed_tokens == 3
    assert request.num_output_placeholders == 2
    # Two outputs are already in flight for max_tokens=2: nothing more is scheduled.
    assert sched.schedule().is_empty


def test_a_request_with_a_step_in_flight_is_never_preempted():
    # 3 blocks of 4: "a" holds 2 (prompt 7 + decode), "b" holds 1; a's next decode needs a
    # fourth block while b's token is in flight.
    sched = make(async_scheduling=True, num_blocks=3, headroom=0)  # admit b as vLLM would
    add(sched, "a", [1, 2, 3, 4, 5, 6, 7], max_tokens=5)
    add(sched, "b", [1, 2], max_tokens=5)
    first = sched.schedule()
    assert first.num_scheduled_tokens == {"a": 7, "b": 2}
    ahead = sched.schedule()  # a: position 7 fits block 2; b: position 2 fits its block
    assert ahead.num_scheduled_tokens == {"a": 1, "b": 1}
    blocked = sched.schedule()  # a at position 8 needs a new block; b is in flight
    assert blocked.is_empty and not blocked.finished_req_ids
    assert all(r.status.name == "RUNNING" for r in sched.running)
