"""The engine busy loop on a fake core (no model): routing of outputs to the client that
owns each request, invalid requests answered without stopping, utilities, stats deltas sent
exactly once, and failures escaping to the caller."""

from __future__ import annotations

import queue
import threading

import pytest

from loom.engine.core_loop import EngineLoop
from loom.engine.protocol import (AbortRequests, EngineCoreOutput, EngineCoreOutputs,
                                  EngineCoreRequest, FinishReason, SchedulerStats, Shutdown,
                                  UtilityCall)
from loom.engine.stats_log import StatsLogger, merge_stats
from loom.sampling_params import SamplingParams


class FakeCore:
    """One token per step per request; a request finishes after max_tokens."""

    def __init__(self, fail_on_step: int | None = None) -> None:
        self.requests: dict[str, list[int]] = {}
        self.limits: dict[str, int] = {}
        self.pending: list[EngineCoreOutput] = []
        self.steps = 0
        self.generated = 0
        self.fail_on_step = fail_on_step

    def add_request(self, r: EngineCoreRequest) -> None:
        if not r.prompt_token_ids:
            raise ValueError("prompt: must not be empty")
        self.requests[r.request_id] = []
        self.limits[r.request_id] = r.sampling_params.max_tokens

    def abort_requests(self, ids: list[str]) -> None:
        for rid in ids:
            if self.requests.pop(rid, None) is not None:
                self.pending.append(EngineCoreOutput(rid, [], finish_reason=FinishReason.ABORT))

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def has_pending_outputs(self) -> bool:
        return bool(self.pending)

    def step(self) -> EngineCoreOutputs:
        self.steps += 1
        if self.steps == self.fail_on_step:
            raise RuntimeError("boom")
        outputs, self.pending = self.pending, []
        for rid, tokens in list(self.requests.items()):
            tokens.append(len(tokens))
            self.generated += 1
            done = len(tokens) >= self.limits[rid]
            outputs.append(EngineCoreOutput(rid, [tokens[-1]],
                                            finish_reason=FinishReason.LENGTH if done else None))
            if done:
                del self.requests[rid]
        stats = SchedulerStats(num_running=len(self.requests), num_generation_tokens=len(outputs))
        return EngineCoreOutputs(outputs=outputs, scheduler_stats=stats)

    def call_utility(self, method: str, args: list) -> object:
        if method == "sleep":  # as EngineCore's: ends the requests, their outputs pending
            self.abort_requests(list(self.requests))
            return 0
        if method != "get_num_unfinished_requests":
            raise ValueError(f"utility: unknown method {method!r}")
        return len(self.requests)


def _request(rid: str, prompt=(1, 2), max_tokens: int = 3) -> EngineCoreRequest:
    return EngineCoreRequest(rid, list(prompt), SamplingParams(max_tokens=max_tokens))


def _run(core: FakeCore, inputs: list, answers: int = 0) -> list[tuple[int, object]]:
    """Run the loop until every request has finished and `answers` utility results went
    out; Shutdown is queued from the send callback then, as a frontend would."""
    q: queue.SimpleQueue = queue.SimpleQueue()
    for item in inputs:
        q.put(item)
    sent: list = []

    def send(client, msg) -> None:
        sent.append((client, msg))
        results = sum(len(m.utility_results) for _, m in sent)
        finished = any(o.finished and o.finish_reason != FinishReason.ERROR for o in msg.outputs)
        if results >= answers and not core.requests and (finished or answers):
            q.put((0, Shutdown()))
    EngineLoop(core, q, send, StatsLogger(10.0, enabled=False)).run()
    return sent


def _outputs(sent, client: int) -> list[EngineCoreOutput]:
    return [o for c, m in sent if c == client and isinstance(m, EngineCoreOutputs) for o in m.outputs]


def test_outputs_go_to_the_client_that_owns_the_request():
    sent = _run(FakeCore(), [(0, _request("a")), (1, _request("b", max_tokens=2))])
    assert [o.new_token_ids for o in _outputs(sent, 0)] == [[0], [1], [2]]
    assert [o.request_id for o in _outputs(sent, 1)] == ["b", "b"]
    assert _outputs(sent, 1)[-1].finish_reason == FinishReason.LENGTH


def test_invalid_request_is_answered_and_the_loop_goes_on():
    sent = _run(FakeCore(), [(1, _request("bad", prompt=())), (0, _request("good", max_tokens=1))])
    error = _outputs(sent, 1)
    assert len(error) == 1 and error[0].finish_reason == FinishReason.ERROR
    assert "prompt" in error[0].error
    assert _outputs(sent, 0)[0].finish_reason == FinishReason.LENGTH


def test_abort_is_answered_within_one_step():
    core = FakeCore()
    q: queue.SimpleQueue = queue.SimpleQueue()
    sent: list = []
    first_output = threading.Event()

    def send(client, msg):
        sent.append((client, msg))
        first_output.set()
        if any(o.finished for o in msg.outputs):
            q.put((0, Shutdown()))
    loop = EngineLoop(core, q, send, StatsLogger(10.0, enabled=False))
    q.put((0, _request("long", max_tokens=10**9)))
    thread = threading.Thread(target=loop.run)
    thread.start()
    assert first_output.wait(10)
    q.put((0, AbortRequests(["long"])))
    thread.join(10)
    assert not thread.is_alive()
    finals = [o for o in _outputs(sent, 0) if o.finished]
    assert [o.finish_reason for o in finals] == [FinishReason.ABORT]
    assert not core.requests and not loop.owners


def test_utilities_answer_the_caller():
    sent = _run(FakeCore(), [(1, UtilityCall(7, "get_num_unfinished_requests")),
                             (1, UtilityCall(8, "no_such_method"))], answers=2)
    results = [r for c, m in sent if c == 1 for r in m.utility_results]
    assert results[0].call_id == 7 and results[0].result == 0 and results[0].error is None
    assert results[1].call_id == 8 and "no_such_method" in results[1].error


def test_outputs_a_utility_leaves_go_out_with_nothing_else_running():
    """A sleep that aborts the requests leaves their outputs pending, and no request is
    left to step for: the loop still steps once, so the owners hear of the abort."""
    core = FakeCore()
    q: queue.SimpleQueue = queue.SimpleQueue()
    sent: list = []

    def send(client, msg):
        sent.append((client, msg))
        if any(o.finished for o in msg.outputs):
            q.put((0, Shutdown()))
    loop = EngineLoop(core, q, send, StatsLogger(10.0, enabled=False))
    core.add_request(_request("r", max_tokens=10**9))  # added, never stepped
    loop.owners["r"] = 1
    q.put((0, UtilityCall(5, "sleep")))
    thread = threading.Thread(target=loop.run)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    assert [o.finish_reason for o in _outputs(sent, 1)] == [FinishReason.ABORT]


def test_stats_deltas_reach_exactly_one_client_and_end_idle():
    core = FakeCore()
    sent = _run(core, [(0, _request("a", max_tokens=4)), (1, _request("b", max_tokens=2))])
    stats = [m.scheduler_stats for _, m in sent if m.scheduler_stats is not None]
    assert sum(s.num_generation_tokens for s in stats) == core.generated == 6
    assert stats[-1].num_running == 0
    # Going idle, the gauges go to every client (None): each API process shows its own.
    client, last = sent[-1]
    assert client is None and last.scheduler_stats.num_running == 0
    assert last.scheduler_stats.num_generation_tokens == 0 and not last.outputs


def test_a_failing_step_escapes():
    with pytest.raises(RuntimeError, match="boom"):
        _run(FakeCore(fail_on_step=2), [(0, _request("a"))])


def test_merge_stats_sums_counters_and_keeps_latest_gauges():
    merged = merge_stats(SchedulerStats(num_running=3, prefix_cache_hits=2, num_prompt_tokens=5),
                         SchedulerStats(num_running=1, prefix_cache_hits=1, num_prompt_tokens=0))
    assert (merged.num_running, merged.prefix_cache_hits, merged.num_prompt_tokens) == (1, 3, 5)


def test_spec_decode_counters_merge_and_log_as_vllms_line(caplog):
    """Speculative decoding's counters add up across steps (per position too), and the
    stats line is followed by vLLM's SpecDecoding line."""
    merged = merge_stats(SchedulerStats(spec_num_drafts=2, spec_num_draft_tokens=8,
                                        spec_num_accepted_tokens=5,
                                        spec_accepted_per_pos=[2, 2, 1, 0]),
                         SchedulerStats(spec_num_drafts=1, spec_num_draft_tokens=4,
                                        spec_num_accepted_tokens=4,
                                        spec_accepted_per_pos=[1, 1, 1, 1]))
    assert (merged.spec_num_drafts, merged.spec_num_draft_tokens,
            merged.spec_num_accepted_tokens, merged.spec_accepted_per_pos) == (3, 12, 9, [3, 3, 2, 1])
    stats = StatsLogger(0.0)
    stats.record(merged)
    with caplog.at_level("INFO", logger="loom.engine"):
        stats.maybe_log()
    line = next(r.getMessage() for r in caplog.records if "SpecDecoding" in r.getMessage())
    assert "Mean acceptance length: 4.00" in line and "Accepted: 9 tokens" in line
    assert "Drafted: 12 tokens" in line and "Avg Draft acceptance rate: 75.0%" in line
    assert "Per-position acceptance rate: 1.000, 1.000, 0.667, 0.333" in line
