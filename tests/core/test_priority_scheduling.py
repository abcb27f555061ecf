"""vLLM's priority scheduling (--scheduling-policy priority): requests are admitted by
(priority, arrival time), lower first; when KV blocks run out the running request with the
largest (priority, arrival time) is preempted, and it waits again in its own place."""

from __future__ import annotations

import msgspec
import pytest

from loom.config import CacheConfig, SchedulerConfig
from loom.core.request import Request, RequestStatus
from loom.core.request_queue import FCFSQueue, PriorityQueue, make_request_queue
from loom.core.sched_output import ModelRunnerOutput
from loom.core.scheduler import Scheduler
from loom.engine.arg_utils import EngineArgs
from loom.engine.protocol import EngineCoreRequest
from loom.frontend.processor import Processor
from loom.lora.request import LoRARequest
from loom.sampling_params import SamplingParams

from tests.core.scheduler_fakes import FakeWorker, step


def _scheduler(policy: str, num_blocks: int = 64, max_num_seqs: int = 8,
               max_loras: int | None = None) -> Scheduler:
    return Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=256,
                                     async_scheduling=False, kv_headroom_tokens=0,
                                     scheduling_policy=policy),
                     CacheConfig(block_size=4, enable_prefix_caching=False), num_blocks, 64,
                     max_loras=max_loras)


def _add(sched: Scheduler, rid: str, priority: int, arrival: float, max_tokens: int = 3,
         lora: LoRARequest | None = None) -> Request:
    request = Request(rid, [1, 2, 3, 4], SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                        ignore_eos=True),
                      arrival_time=arrival, lora_request=lora, priority=priority)
    sched.add_request(request)
    return request


def _first_scheduled(sched: Scheduler) -> list[str]:
    """Run to the end; the order in which requests were first scheduled."""
    worker, order = FakeWorker(), []
    while sched.has_unfinished_requests():
        out, _ = step(sched, worker)
        order += [r.req_id for r in out.new_reqs if r.req_id not in order]
    return order


def test_admission_by_priority_then_arrival():
    sched = _scheduler("priority", max_num_seqs=1)
    for rid, priority, arrival in [("a", 2, 0.0), ("b", 0, 3.0), ("c", 1, 1.0), ("d", 0, 2.0)]:
        _add(sched, rid, priority, arrival)
    assert _first_scheduled(sched) == ["d", "b", "c", "a"]


def test_fcfs_ignores_priority():
    sched = _scheduler("fcfs", max_num_seqs=1)
    for rid, priority in [("a", 2), ("b", 0), ("c", 1)]:
        _add(sched, rid, priority, 0.0)
    assert _first_scheduled(sched) == ["a", "b", "c"]


def _first_victim(policy: str) -> tuple[Scheduler, FakeWorker, str]:
    """a (priority 1) and b (priority 2) run; c (priority 0) arrives later and is admitted;
    then the blocks run out. Returns the scheduler and worker at the first preemption, and
    its victim."""
    sched, worker = _scheduler(policy, num_blocks=8), FakeWorker()
    _add(sched, "a", 1, 0.0, max_tokens=20)
    _add(sched, "b", 2, 1.0, max_tokens=20)
    step(sched, worker)
    _add(sched, "c", 0, 2.0, max_tokens=20)
    for _ in range(40):
        step(sched, worker)
        preempted = [r.request_id for r in sched.waiting if r.status == RequestStatus.PREEMPTED]
        if preempted:
            return sched, worker, preempted[0]
    raise AssertionError("nothing was preempted")


def test_preemption_picks_the_lowest_priority_running_request():
    assert _first_victim("priority")[2] == "b"
    assert _first_victim("fcfs")[2] == "c"  # the most recently admitted, as before


def test_preempted_request_waits_in_its_place():
    sched, worker, victim = _first_victim("priority")
    _add(sched, "late_high", 1, 9.0)
    _add(sched, "late_low", 3, 8.0)
    assert [r.request_id for r in sched.waiting] == ["late_high", victim, "late_low"]
    while sched.has_unfinished_requests():  # everyone still finishes
        step(sched, worker)


def test_running_list_is_kept_in_rank_order():
    sched, worker = _scheduler("priority"), FakeWorker()
    _add(sched, "a", 5, 0.0, max_tokens=10)
    step(sched, worker)
    _add(sched, "b", 1, 1.0, max_tokens=10)
    _add(sched, "c", 5, 2.0, max_tokens=10)
    step(sched, worker)
    assert [r.request_id for r in sched.running] == ["b", "a", "c"]


def test_lora_passed_over_request_keeps_its_rank():
    sched = _scheduler("priority", max_loras=1)
    _add(sched, "a", 0, 0.0, lora=LoRARequest("x", 1, "/x"))
    _add(sched, "b", 1, 1.0, lora=LoRARequest("y", 2, "/y"))
    _add(sched, "c", 2, 2.0)
    _add(sched, "d", 3, 3.0, lora=LoRARequest("y", 2, "/y"))
    sched.schedule()
    assert [r.request_id for r in sched.running] == ["a", "c"]
    assert [r.request_id for r in sched.waiting] == ["b", "d"]


def test_queues_put_requests_back_as_their_policy_says():
    reqs = [Request(f"r{i}", [1], SamplingParams(), arrival_time=float(i), priority=p)
            for i, p in enumerate([1, 0, 2])]
    fcfs, prio = FCFSQueue(), PriorityQueue()
    for q in (fcfs, prio):
        for r in reqs[:2]:
            q.add(r)
        q.prepend(reqs[2])
        popped = [q.pop()]
        q.put_back(popped)
    assert [r.request_id for r in fcfs] == ["r2", "r0", "r1"]
    assert [r.request_id for r in prio] == ["r1", "r0", "r2"]
    prio.remove(reqs[0])
    assert len(prio) == 2 and prio.peek() is reqs[1]


def test_bad_policy_is_a_value_error_naming_the_field():
    with pytest.raises(ValueError, match="scheduling_policy"):
        SchedulerConfig(scheduling_policy="lifo")
    with pytest.raises(ValueError, match="scheduling_policy"):
        EngineArgs(model="x", scheduling_policy="lifo").create_engine_config()
    with pytest.raises(ValueError, match="scheduling_policy"):
        make_request_queue("lifo")


def _processor(policy: str) -> Processor:
    return Processor(None, 64, 100, None, scheduling_policy=policy)


def test_processor_refuses_a_priority_without_the_priority_policy():
    params = SamplingParams(max_tokens=2)
    assert _processor("fcfs").process("r", [1, 2], params, priority=0).priority == 0
    with pytest.raises(ValueError, match=r"^priority: .*Priority scheduling is not enabled"):
        _processor("fcfs").process("r", [1, 2], params, priority=1)
    request = _processor("priority").process("r", [1, 2], params, priority=-3)
    assert request.priority == -3
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=EngineCoreRequest)
    assert Request.from_engine_core_request(decoded).priority == -3


@pytest.mark.parametrize("value", ["1", 1.5, True, None, 2**63])
def test_processor_refuses_a_priority_that_is_not_an_integer(value):
    with pytest.raises(ValueError, match="^priority: must"):
        _processor("priority").process("r", [1, 2], SamplingParams(max_tokens=2),
                                       priority=value)


def test_runner_output_order_does_not_matter_to_priority():
    """The batch lists running requests in rank order; outputs map back by id."""
    sched = _scheduler("priority")
    _add(sched, "a", 3, 0.0, max_tokens=1)
    _add(sched, "b", 0, 1.0, max_tokens=1)
    out = sched.schedule()
    assert [r.req_id for r in out.new_reqs] == ["b", "a"]
    outputs = sched.update_from_output(out, ModelRunnerOutput(
        req_ids=list(out.num_scheduled_tokens), sampled_token_ids=[[7], [8]]))
    assert {o.request_id: o.new_token_ids for o in outputs} == {"b": [7], "a": [8]}
