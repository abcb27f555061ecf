"""The scheduler's outputs: when a request stops, prefix-cache hits, logprobs, stats, and
what add_request refuses."""

from __future__ import annotations

import pytest

from loom.core.request import Request
from loom.core.sched_output import ModelRunnerOutput
from loom.engine.protocol import EngineCoreOutput, FinishReason, Logprobs
from tests.core.scheduler_fakes import (FakeWorker, add, make_scheduler, run_to_end,
                                        scripted, step)


# -- stopping ----------------------------------------------------------------------------

def finish(prompt: list[int], tokens: list[int], eos: int | None = None, max_model_len: int = 64,
           **params) -> tuple[Request, EngineCoreOutput]:
    sched = make_scheduler(max_model_len=max_model_len)
    request = add(sched, "r", prompt, eos=eos, **params)
    outs = run_to_end(sched, scripted(tokens))
    assert sched.kv_cache_manager.num_free_blocks == 64
    return request, outs[-1]


def test_stop_token_ids():
    request, last = finish([1], [5, 9, 6], stop_token_ids=[9])
    assert request.output_token_ids == [5, 9]
    assert (last.finish_reason, last.stop_reason) == (FinishReason.STOP, 9)


def test_stop_token_wins_over_max_tokens_on_the_same_token():
    request, last = finish([1], [5, 9], stop_token_ids=[9], max_tokens=2)
    assert (last.finish_reason, last.stop_reason) == (FinishReason.STOP, 9)


def test_eos():
    request, last = finish([1], [5, 2, 6], eos=2)
    assert request.output_token_ids == [5, 2]
    assert (last.finish_reason, last.stop_reason) == (FinishReason.STOP, None)


def test_min_tokens_delays_stops_until_reached():
    # The third token is the first that may stop: eos 2 and stop 9 before it are kept.
    request, last = finish([1], [2, 9, 2, 7], eos=2, stop_token_ids=[9], min_tokens=3)
    assert request.output_token_ids == [2, 9, 2]
    assert last.finish_reason == FinishReason.STOP


def test_ignore_eos_runs_to_max_tokens():
    request, last = finish([1], [2, 2, 2, 2], eos=2, ignore_eos=True, max_tokens=3)
    assert request.output_token_ids == [2, 2, 2]
    assert last.finish_reason == FinishReason.LENGTH


def test_max_model_len_ends_the_request():
    request, last = finish([1, 2, 3, 4, 5, 6], [7] * 10, max_model_len=8, max_tokens=None)
    assert request.output_token_ids == [7, 7]  # 6 + 2 = 8 tokens
    assert last.finish_reason == FinishReason.LENGTH


def test_tokens_after_a_stop_in_one_step_are_dropped():
    sched = make_scheduler()
    add(sched, "r", [1], stop_token_ids=[9])
    out = sched.schedule()
    outs = sched.update_from_output(out, ModelRunnerOutput(["r"], [[5, 9, 6]]))
    assert outs[0].new_token_ids == [5, 9] and outs[0].finished


# -- prefix cache, logprobs, stats -------------------------------------------------------

def test_prefix_hit_skips_shared_blocks():
    sched, worker = make_scheduler(num_blocks=16), FakeWorker()
    add(sched, "a", list(range(10)), max_tokens=1)
    step(sched, worker)
    add(sched, "b", list(range(8)) + [50, 51, 52], max_tokens=1)
    add(sched, "c", list(range(8)), max_tokens=1)
    out, outs = step(sched, worker)
    b, c = out.new_reqs
    assert (b.num_computed_tokens, out.num_scheduled_tokens["b"]) == (8, 3)
    assert b.block_ids[:2] == [0, 1]
    assert (c.num_computed_tokens, out.num_scheduled_tokens["c"]) == (4, 4)  # not all 8
    assert [o.num_cached_tokens for o in outs] == [8, 4]
    stats = sched.make_stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (10 + 11 + 8, 12)


def test_logprobs_are_passed_through_even_for_a_chunk():
    sched = make_scheduler(budget=4)
    add(sched, "r", list(range(6)), prompt_logprobs=0, logprobs=0)
    lp = Logprobs([1], [-0.5], 1)
    out = sched.schedule()
    outs = sched.update_from_output(out, ModelRunnerOutput(["r"], [[]], [None], {"r": [lp] * 3}))
    assert outs == [EngineCoreOutput("r", [], prompt_logprobs=[lp] * 3,
                                     queue_time_s=outs[0].queue_time_s)]
    assert outs[0].queue_time_s is not None and outs[0].prefill_time_s is None  # no token yet
    out = sched.schedule()
    outs = sched.update_from_output(out, ModelRunnerOutput(["r"], [[8]], [lp], {"r": [lp] * 2}))
    assert outs == [EngineCoreOutput("r", [8], new_logprobs=[lp], prompt_logprobs=[lp] * 2,
                                     prefill_time_s=outs[0].prefill_time_s)]
    assert outs[0].prefill_time_s >= 0  # with the first token


def test_stats_are_deltas():
    sched, worker = make_scheduler(num_blocks=10, max_num_seqs=1), FakeWorker()
    add(sched, "a", list(range(6)), max_tokens=3)
    add(sched, "b", list(range(3)), max_tokens=3)
    step(sched, worker)
    step(sched, worker)
    stats = sched.make_stats()
    assert (stats.num_running, stats.num_waiting) == (1, 1)
    assert stats.kv_cache_usage == pytest.approx(0.2)  # a's 7 tokens in 2 of 10 blocks
    assert (stats.num_prompt_tokens, stats.num_generation_tokens) == (6, 2)
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (6, 0)
    stats = sched.make_stats()
    assert (stats.num_prompt_tokens, stats.num_generation_tokens, stats.prefix_cache_queries,
            stats.num_preemptions) == (0, 0, 0, 0)


def test_reset_prefix_cache_waits_for_idle():
    sched, worker = make_scheduler(), FakeWorker()
    add(sched, "a", list(range(9)), max_tokens=2)
    step(sched, worker)
    assert sched.reset_prefix_cache() is False
    run_to_end(sched, worker)
    assert sched.reset_prefix_cache() is True


def test_add_request_rejects_what_can_never_run():
    sched = make_scheduler(num_blocks=4, max_model_len=32)
    add(sched, "a", [1])
    assert sched.has_request("a")
    with pytest.raises(ValueError, match="already in use"):
        add(sched, "a", [1])
    with pytest.raises(ValueError, match="empty prompt"):
        add(sched, "b", [])
    with pytest.raises(ValueError, match="max_model_len"):
        add(sched, "c", [1] * 33)
    with pytest.raises(ValueError, match="KV cache"):
        add(sched, "d", [1] * 10, max_tokens=8)  # 17 tokens of KV > 4 blocks of 4
    add(sched, "e", [1] * 10, max_tokens=7)  # exactly 16
