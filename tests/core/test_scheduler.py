"""The scheduler: batching, preemption, admission headroom and abort (stopping, the
prefix cache, logprobs and stats: test_scheduler_outputs.py)."""

from __future__ import annotations

import time

import pytest

from loom.config import CacheConfig, SchedulerConfig
from loom.core.request import Request, RequestStatus
from loom.core.scheduler import Scheduler
from loom.engine.protocol import EngineCoreOutput, FinishReason
from tests.core.scheduler_fakes import (BS, FakeWorker, add, make_scheduler, run_to_end,
                                        step)


# -- batching ---------------------------------------------------------------------------

def test_one_request_prefills_then_decodes_to_max_tokens():
    sched, worker = make_scheduler(num_blocks=8), FakeWorker()
    request = add(sched, "a", [1, 2, 3, 4, 5], max_tokens=3)
    out, outs = step(sched, worker)
    assert [n.req_id for n in out.new_reqs] == ["a"] and out.cached_reqs == []
    assert out.new_reqs[0].token_ids == [1, 2, 3, 4, 5]
    assert out.new_reqs[0].block_ids == [0, 1]  # ceil(5 / 4)
    assert out.num_scheduled_tokens == {"a": 5} and out.total_num_scheduled_tokens == 5
    # The first output reports how long the request waited to be scheduled, and how long
    # from there to its first token, once.
    assert 0 <= outs[0].queue_time_s < 1 and 0 <= outs[0].prefill_time_s < 1
    assert outs == [EngineCoreOutput("a", [105], queue_time_s=outs[0].queue_time_s,
                                     prefill_time_s=outs[0].prefill_time_s)]
    out, outs = step(sched, worker)
    assert outs[0].queue_time_s is None and outs[0].prefill_time_s is None
    assert out.num_scheduled_tokens == {"a": 1}
    assert out.cached_reqs[0].num_computed_tokens == 5
    out, outs = step(sched, worker)
    assert outs == [EngineCoreOutput("a", [107], finish_reason=FinishReason.LENGTH)]
    assert request.output_token_ids == [105, 106, 107]
    assert request.status == RequestStatus.FINISHED_LENGTH
    assert sched.kv_cache_manager.num_free_blocks == 8
    assert not sched.has_unfinished_requests()
    assert sched.schedule().finished_req_ids == ["a"]


def test_prefill_time_runs_from_first_scheduling_to_the_first_token():
    """A prompt in two chunks: the time is the first token's, counted from the first
    chunk's scheduling, not from the last chunk's, nor from the request's arrival."""
    sched, worker = make_scheduler(budget=4), FakeWorker()
    add(sched, "a", list(range(1, 7)), max_tokens=2)
    time.sleep(0.05)  # queued: counts in queue_time, not in prefill_time
    _, outs = step(sched, worker)
    assert outs == []  # a chunk: no token, nothing reported yet
    time.sleep(0.05)  # between the chunks: counts in prefill_time
    _, outs = step(sched, worker)
    assert outs[0].new_token_ids == [106]
    assert outs[0].queue_time_s >= 0.05 and 0.05 <= outs[0].prefill_time_s < 1
    assert outs[0].queue_time_s + outs[0].prefill_time_s >= 0.1


def test_chunked_prefill_under_a_small_budget():
    sched, worker = make_scheduler(budget=4), FakeWorker()
    add(sched, "a", list(range(10)), max_tokens=2)
    expected = [(4, [0], []), (4, [1], []), (2, [2], [110])]  # tokens, new blocks, sampled
    for i, (n, blocks, sampled) in enumerate(expected):
        out, outs = step(sched, worker)
        assert out.num_scheduled_tokens == {"a": n}
        assert (out.new_reqs[0].block_ids if i == 0 else out.cached_reqs[0].new_block_ids) == blocks
        assert [o.new_token_ids for o in outs] == ([sampled] if sampled else [])
    out, outs = step(sched, worker)
    assert out.num_scheduled_tokens == {"a": 1}
    assert outs[0].new_token_ids == [111] and outs[0].finished


def test_new_requests_come_first_in_batch_order():
    sched, worker = make_scheduler(budget=6), FakeWorker()
    add(sched, "a", list(range(10)))
    add(sched, "b", [1, 2, 3])
    out, _ = step(sched, worker)
    assert out.num_scheduled_tokens == {"a": 6}  # budget spent: b waits
    out, _ = step(sched, worker)
    assert list(out.num_scheduled_tokens.items()) == [("b", 2), ("a", 4)]
    out, outs = step(sched, worker)
    assert list(out.num_scheduled_tokens.items()) == [("a", 1), ("b", 1)]
    assert [(o.request_id, o.new_token_ids) for o in outs] == [("a", [111]), ("b", [103])]


def test_a_second_schedule_before_update_has_nothing_to_compute_without_async():
    sched = Scheduler(SchedulerConfig(async_scheduling=False), CacheConfig(block_size=BS), 64, 256)
    add(sched, "a", [1, 2, 3])
    assert sched.schedule().num_scheduled_tokens == {"a": 3}
    out = sched.schedule()
    assert out.is_empty and out.cached_reqs == [] and out.num_scheduled_tokens == {}


def test_max_num_seqs_caps_running_requests():
    sched, worker = make_scheduler(max_num_seqs=2), FakeWorker()
    add(sched, "a", [1, 2], max_tokens=1)
    add(sched, "b", [1, 2], max_tokens=3)
    add(sched, "c", [1, 2], max_tokens=1)
    out, _ = step(sched, worker)
    assert list(out.num_scheduled_tokens) == ["a", "b"]
    assert (len(sched.running), len(sched.waiting)) == (1, 1)  # a finished
    out, _ = step(sched, worker)
    assert list(out.num_scheduled_tokens) == ["c", "b"]
    assert out.finished_req_ids == ["a"]


# -- preemption --------------------------------------------------------------------------

def test_preemption_when_blocks_run_out_then_resume():
    # 4 blocks of 4. Each request needs ceil((4 + k) / 4) blocks after k decodes: both
    # fit in 2 blocks until step 6, when a needs a third and b, the last, is preempted.
    # c waits behind them (max_num_seqs=2), and must stay behind b once b is preempted.
    sched = make_scheduler(num_blocks=4, max_num_seqs=2, caching=False, headroom=0)
    worker = FakeWorker()
    a = add(sched, "a", [1, 2, 3, 4], max_tokens=8)
    b = add(sched, "b", [5, 6, 7, 8], max_tokens=8)
    c = add(sched, "c", [9], max_tokens=1)
    for _ in range(5):
        out, _ = step(sched, worker)
        assert set(out.num_scheduled_tokens) == {"a", "b"}
    out, _ = step(sched, worker)
    assert out.num_scheduled_tokens == {"a": 1}
    assert out.finished_req_ids == ["b"]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert list(sched.waiting) == [b, c] and b.num_tokens == 9
    for _ in range(2):  # a runs its last two tokens; b does not fit (3 blocks, 1 free)
        out, _ = step(sched, worker)
        assert out.num_scheduled_tokens == {"a": 1}
    assert a.status == RequestStatus.FINISHED_LENGTH
    out, _ = step(sched, worker)
    assert [n.req_id for n in out.new_reqs] == ["b", "c"]
    assert out.new_reqs[0].token_ids == [5, 6, 7, 8, 104, 105, 106, 107, 108]
    assert out.num_scheduled_tokens == {"b": 9, "c": 1}
    assert len(out.new_reqs[0].block_ids) == 3
    run_to_end(sched, worker)
    assert b.output_token_ids == list(range(104, 112))  # nothing lost or repeated
    assert a.output_token_ids == list(range(104, 112))
    assert c.output_token_ids == [101]
    assert sched.kv_cache_manager.num_free_blocks == 4
    stats = sched.make_stats()
    # b's prompt counts once although it was prefilled twice.
    assert (stats.num_preemptions, stats.num_prompt_tokens, stats.num_generation_tokens) == (
        1, 4 + 4 + 1, 8 + 8 + 1)


def test_a_request_that_cannot_grow_preempts_itself():
    # 3 blocks: a (5 tokens) holds 2 with room to 8; b (4 tokens) fills its only block.
    sched, worker = make_scheduler(num_blocks=3, caching=False, headroom=0), FakeWorker()
    a = add(sched, "a", [1, 2, 3, 4, 5], max_tokens=3)
    b = add(sched, "b", [6, 7, 8, 9], max_tokens=2)
    step(sched, worker)
    out, _ = step(sched, worker)
    assert out.num_scheduled_tokens == {"a": 1}
    assert out.finished_req_ids == ["b"] and b.status == RequestStatus.PREEMPTED
    run_to_end(sched, worker)
    assert a.output_token_ids == [105, 106, 107]
    assert b.output_token_ids == [104, 105]
    assert sched.kv_cache_manager.num_free_blocks == 3


# -- admission headroom ------------------------------------------------------------------

def _serve_four(headroom: int | None) -> tuple[Scheduler, list[Request], list[int], int]:
    """Four 8-token prompts that each decode 13 tokens (20 of KV, 5 blocks) in 10 blocks.
    Returns the scheduler, the requests, the prompt tokens computed per step and the most
    requests running at once."""
    sched, worker = make_scheduler(num_blocks=10, caching=False, headroom=headroom), FakeWorker()
    requests = [add(sched, f"r{i}", list(range(10 * i, 10 * i + 8)), max_tokens=13)
                for i in range(4)]
    prompt_tokens, most_running = [], 0
    for _ in range(100):
        if not sched.has_unfinished_requests():
            break
        out, _ = step(sched, worker)
        prompt_tokens.append(sum(n for n in out.num_scheduled_tokens.values() if n > 1))
        most_running = max(most_running, len(sched.running))
    return sched, requests, prompt_tokens, most_running


def test_headroom_admits_what_can_decode_to_the_end_so_nothing_is_recomputed():
    sched, requests, prompt_tokens, most_running = _serve_four(headroom=None)
    # r0 alone; r1 needs 5 blocks and r0 3 more: 8 of the 8 free. r2 would need 5 more.
    assert most_running == 2
    assert sched.make_stats().num_preemptions == 0
    assert sum(prompt_tokens) == 4 * 8  # every prompt computed once
    # vLLM's admission takes all four at once, runs out of blocks decoding and recomputes.
    vllm, vllm_requests, vllm_prompt_tokens, vllm_most = _serve_four(headroom=0)
    assert vllm_most == 4 and vllm.make_stats().num_preemptions > 0
    assert sum(vllm_prompt_tokens) > 4 * 8
    # The same tokens either way (the fake model's token depends on its position only).
    for r, v in zip(requests, vllm_requests):
        assert r.output_token_ids == v.output_token_ids == list(range(108, 121))
    assert sched.kv_cache_manager.num_free_blocks == 10


def test_headroom_counts_at_most_kv_headroom_tokens_a_request():
    # No max_tokens: each 4-token prompt is counted at 4 + 8 tokens (11 of KV, 3 blocks), not
    # at max_model_len. a: 1 block now, 2 to come; b fits (3 + 2 <= 5 free); c not (3 + 4).
    sched, worker = make_scheduler(num_blocks=6, caching=False, headroom=8,
                                   max_model_len=24), FakeWorker()
    for rid in "abc":
        add(sched, rid, [1, 2, 3, 4], max_tokens=None)
    out, _ = step(sched, worker)
    assert list(out.num_scheduled_tokens) == ["a", "b"]
    sched = make_scheduler(num_blocks=6, caching=False, headroom=0, max_model_len=24)
    for rid in "abc":
        add(sched, rid, [1, 2, 3, 4], max_tokens=None)
    assert list(sched.schedule().num_scheduled_tokens) == ["a", "b", "c"]


def test_negative_headroom_is_refused():
    with pytest.raises(ValueError, match="kv_headroom_tokens"):
        SchedulerConfig(kv_headroom_tokens=-1)


# -- abort -------------------------------------------------------------------------------

# Budget 4, 4 blocks of 4. Step 1: a 4. Step 2: b 2, a 2 (a samples). Step 3: a 1, b 3.
# Step 4: a 1, b 2 (b samples). Step 5: a needs a third block, so b is preempted.
STAGES = {  # steps before the abort -> (a's status, a's computed, b's status, b's computed)
    0: (RequestStatus.WAITING, 0, RequestStatus.WAITING, 0),
    1: (RequestStatus.RUNNING, 4, RequestStatus.WAITING, 0),
    3: (RequestStatus.RUNNING, 7, RequestStatus.RUNNING, 5),
    5: (RequestStatus.RUNNING, 9, RequestStatus.PREEMPTED, 0),
}


@pytest.mark.parametrize("steps_before_abort", sorted(STAGES))
def test_abort_at_every_stage_frees_everything(steps_before_abort):
    sched, worker = make_scheduler(num_blocks=4, budget=4, caching=False,
                                   headroom=0), FakeWorker()
    a = add(sched, "a", [1, 2, 3, 4, 5, 6], max_tokens=6)
    b = add(sched, "b", [1, 2, 3, 4, 5, 6, 7], max_tokens=5)
    for _ in range(steps_before_abort):
        step(sched, worker)
    stage = (a.status, a.num_computed_tokens, b.status, b.num_computed_tokens)
    assert stage == STAGES[steps_before_abort]
    outs = sched.abort_requests(["b", "a", "unknown"])
    assert a.status == b.status == RequestStatus.FINISHED_ABORTED
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in outs] == [
        ("b", [], FinishReason.ABORT), ("a", [], FinishReason.ABORT)]
    assert sched.kv_cache_manager.num_free_blocks == 4
    assert not sched.has_unfinished_requests()
    out = sched.schedule()
    assert sorted(out.finished_req_ids) == ["a", "b"] and out.is_empty


def test_abort_between_schedule_and_update_is_skipped():
    sched, worker = make_scheduler(num_blocks=8, headroom=0), FakeWorker()
    add(sched, "a", [1, 2, 3])
    add(sched, "b", [4, 5, 6])
    out = sched.schedule()
    sched.abort_requests(["a"])
    outs = sched.update_from_output(out, worker.execute(out))
    assert [o.request_id for o in outs] == ["b"]
    assert sched.kv_cache_manager.num_free_blocks == 7  # b's one block
    assert sched.abort_requests(["a"]) == []


def test_abort_after_finish_is_ignored():
    sched, worker = make_scheduler(num_blocks=8), FakeWorker()
    add(sched, "a", [1, 2, 3], max_tokens=1)
    step(sched, worker)
    assert not sched.has_request("a")
    assert sched.abort_requests(["a"]) == []
    assert sched.kv_cache_manager.num_free_blocks == 8
