"""max_loras in the scheduler: the running requests never use more adapters than there are
slots; a request whose adapter would be one too many is passed over (and others go ahead),
then admitted in its turn once a slot's requests have finished."""

from __future__ import annotations

from loom.config import CacheConfig, SchedulerConfig
from loom.core.request import Request
from loom.core.sched_output import ModelRunnerOutput
from loom.core.scheduler import Scheduler
from loom.lora.request import LoRARequest
from loom.sampling_params import SamplingParams


def _lora(i: int) -> LoRARequest:
    return LoRARequest(f"a{i}", i, f"/adapters/{i}")


def _run(max_loras: int | None, loras: list[int | None], max_tokens: int = 3):
    """Schedule requests (one per entry: its adapter id or None) to the end; return the
    adapter ids running at each step and the order requests were first scheduled in."""
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256,
                                      async_scheduling=False),
                      CacheConfig(block_size=4), 256, 128, max_loras=max_loras)
    for i, lora in enumerate(loras):
        sched.add_request(Request(f"r{i}", [5, 6, 7], SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
            lora_request=None if lora is None else _lora(lora)))
    steps, order = [], []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        order += [r.req_id for r in out.new_reqs]
        steps.append({r.lora_request.lora_int_id for r in sched.running if r.lora_request})
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=list(out.num_scheduled_tokens),
            sampled_token_ids=[[9] for _ in out.num_scheduled_tokens]))
    return steps, order


def test_one_slot_runs_one_adapter_at_a_time_and_others_go_ahead():
    steps, order = _run(1, [1, 2, None, 1, 2])
    assert all(len(s) <= 1 for s in steps)
    # r1 (adapter 2) is passed over: the base request and adapter 1's next go ahead of it.
    assert order == ["r0", "r2", "r3", "r1", "r4"]
    assert {i for s in steps for i in s} == {1, 2}


def test_enough_slots_admit_in_arrival_order():
    steps, order = _run(2, [1, 2, None, 1, 2])
    assert order == [f"r{i}" for i in range(5)] and max(len(s) for s in steps) == 2


def test_lora_off_admits_everything():
    steps, order = _run(None, [1, 2, 3])
    assert order == ["r0", "r1", "r2"] and steps[0] == {1, 2, 3}


def test_stats_name_the_adapters_running_and_waiting():
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256),
                      CacheConfig(block_size=4), 256, 128, max_loras=1)
    for i, lora in enumerate([1, 2, None]):
        sched.add_request(Request(f"r{i}", [5, 6, 7], SamplingParams(max_tokens=3),
                                  lora_request=None if lora is None else _lora(lora)))
    sched.schedule()
    stats = sched.make_stats()
    assert (stats.max_loras, stats.running_lora_adapters, stats.waiting_lora_adapters) == (
        1, ["a1"], ["a2"])
    off = Scheduler(SchedulerConfig(), CacheConfig(block_size=4), 16, 128).make_stats()
    assert (off.max_loras, off.running_lora_adapters) == (0, [])


def test_an_adapter_that_failed_to_load_ends_its_requests_once():
    """A step's load failure ends every request of that adapter, running or waiting, and
    takes their prompt blocks out of the prefix cache (they hold KV computed without the
    adapter); the base model's request goes on. The same failure reported again by a step
    that was in flight ends nothing: a request of the adapter added since stays."""
    from loom.engine.protocol import FinishReason
    sched = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=256),
                      CacheConfig(block_size=4, enable_prefix_caching=True), 64, 128,
                      max_loras=2)
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    for rid, lora in (("r0", 1), ("r1", 1), ("base", None)):
        sched.add_request(Request(rid, list(range(10, 19)), params,
                                  lora_request=None if lora is None else _lora(lora)))
    step = sched.schedule()
    assert list(step.num_scheduled_tokens) == ["r0"]
    cached = sched.kv_cache_manager.get_computed_blocks(sched.requests["r1"])[1]
    assert cached == 8  # r1 would reuse r0's two full blocks
    outs = sched.update_from_output(step, ModelRunnerOutput(
        req_ids=["r0"], sampled_token_ids=[[9]], lora_errors={1: "a1: unreadable"}))
    assert {(o.request_id, o.finish_reason, o.error) for o in outs} == {
        ("r0", FinishReason.ERROR, "a1: unreadable"), ("r1", FinishReason.ERROR, "a1: unreadable")}
    assert list(sched.requests) == ["base"] and sched.finished_req_ids == ["r0", "r1"]
    sched.add_request(Request("r2", list(range(10, 19)), params, lora_request=_lora(1)))
    assert sched.kv_cache_manager.get_computed_blocks(sched.requests["r2"])[1] == 0
    assert sched.update_from_output(step, ModelRunnerOutput(
        req_ids=["r0"], sampled_token_ids=[[9]], lora_errors={1: "a1: unreadable"})) == []
    assert set(sched.requests) == {"base", "r2"}
