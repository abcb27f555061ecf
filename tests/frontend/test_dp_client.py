"""DPClient over fake replicas: where each message goes, and what comes back combined."""

from __future__ import annotations

import os

import pytest

from loom.config import DeviceConfig, EngineConfig, ModelConfig, ParallelConfig
from loom.engine.core_proc import take_devices
from loom.engine.protocol import (AbortRequests, EngineCoreOutput, EngineCoreOutputs,
                                  EngineCoreRequest, EngineDead, EngineReady, FinishReason,
                                  SchedulerStats, Shutdown, UtilityCall, UtilityResult)
from loom.frontend.core_client import EngineCoreClient
from loom.frontend.dp_client import DPClient
from loom.sampling_params import SamplingParams


class FakeReplica(EngineCoreClient):
    def __init__(self, pid: int, num_blocks: int = 100) -> None:
        self.info = EngineReady(256, 128, None, num_blocks, 16)
        self.engine_pid = pid
        self.sent: list = []
        self.on_message = None

    def start(self, on_message) -> None:
        self.on_message = on_message

    def send(self, message) -> None:
        self.sent.append(message)

    async def close(self) -> None:
        pass


def _dp(n: int = 2):
    replicas = [FakeReplica(1000 + i, num_blocks=100 - i) for i in range(n)]
    client = DPClient(replicas)
    received: list = []
    client.start(received.append)
    return client, replicas, received


def _request(request_id: str) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1, 2, 3], SamplingParams(max_tokens=4))


def _finished(request_id: str) -> EngineCoreOutputs:
    return EngineCoreOutputs([EngineCoreOutput(request_id, [5], finish_reason=FinishReason.STOP)])


def test_requests_go_to_the_least_loaded_replica_in_turns():
    client, replicas, _ = _dp(3)
    for i in range(6):
        client.send(_request(f"r{i}"))
    assert [[m.request_id for m in r.sent] for r in replicas] == [["r0", "r3"], ["r1", "r4"],
                                                                 ["r2", "r5"]]
    assert client.in_flight == [2, 2, 2] and client.routed == [2, 2, 2]
    # r1 and r4 finish on replica 1: the next two requests go there.
    replicas[1].on_message(_finished("r1"))
    replicas[1].on_message(_finished("r4"))
    client.send(_request("r6"))
    client.send(_request("r7"))
    assert [m.request_id for m in replicas[1].sent[2:]] == ["r6", "r7"]
    assert client.in_flight == [2, 2, 2]


def test_aborts_follow_their_requests():
    client, replicas, _ = _dp(2)
    for i in range(4):
        client.send(_request(f"r{i}"))
    client.send(AbortRequests(["r3", "r0", "gone", "r2"]))
    assert replicas[0].sent[-1] == AbortRequests(["r0", "r2"])
    assert replicas[1].sent[-1] == AbortRequests(["r3"])
    assert client.in_flight == [0, 1]
    # An abort's own finished output does not count the request twice.
    replicas[0].on_message(EngineCoreOutputs([EngineCoreOutput(
        "r0", [], finish_reason=FinishReason.ABORT)]))
    assert client.in_flight == [0, 1]


@pytest.mark.parametrize("method, answers, combined", [
    ("get_num_unfinished_requests", [3, 4], 7),
    ("reset_prefix_cache", [True, False], False),
    ("reset_prefix_cache", [True, True], True),
    ("get_kv_info", [{"num_blocks": 100, "num_free_blocks": 40, "block_size": 16},
                     {"num_blocks": 99, "num_free_blocks": 9, "block_size": 16}],
     {"num_blocks": 199, "num_free_blocks": 49, "block_size": 16}),
    ("get_model_info", [{"vocab_size": 256}, {"vocab_size": 256}], {"vocab_size": 256}),
])
def test_utility_calls_go_to_every_replica_and_answer_once(method, answers, combined):
    client, replicas, received = _dp(2)
    client.send(UtilityCall(7, method))
    assert all(r.sent == [UtilityCall(7, method)] for r in replicas)
    replicas[1].on_message(EngineCoreOutputs(utility_results=[UtilityResult(7, answers[1])]))
    assert received[-1].utility_results == []  # the other replica has not answered yet
    replicas[0].on_message(EngineCoreOutputs(utility_results=[UtilityResult(7, answers[0])]))
    assert received[-1].utility_results == [UtilityResult(7, combined)]


def test_a_replicas_utility_error_is_the_answer():
    client, replicas, received = _dp(2)
    client.send(UtilityCall(1, "get_kv_info"))
    replicas[0].on_message(EngineCoreOutputs(utility_results=[UtilityResult(1, error="boom")]))
    replicas[1].on_message(EngineCoreOutputs(utility_results=[UtilityResult(1, {})]))
    assert received[-1].utility_results == [UtilityResult(1, error="boom")]


def test_stats_gauges_cover_every_replica_and_deltas_pass_as_they_come():
    client, replicas, received = _dp(2)
    replicas[0].on_message(EngineCoreOutputs(scheduler_stats=SchedulerStats(
        num_running=3, num_waiting=1, kv_cache_usage=0.5, num_prompt_tokens=10,
        running_lora_adapters=["a"])))
    first = received[-1].scheduler_stats
    assert (first.num_running, first.num_waiting, first.kv_cache_usage) == (3, 1, 0.25)
    replicas[1].on_message(EngineCoreOutputs(scheduler_stats=SchedulerStats(
        num_running=2, kv_cache_usage=0.1, num_prompt_tokens=7, running_lora_adapters=["b"])))
    both = received[-1].scheduler_stats
    assert (both.num_running, both.num_waiting) == (5, 1)
    assert both.kv_cache_usage == pytest.approx(0.3)
    assert both.num_prompt_tokens == 7  # a delta: replica 1's own
    assert both.running_lora_adapters == ["a", "b"]


def test_the_first_replica_to_die_ends_the_server_once():
    client, replicas, received = _dp(2)
    replicas[1].on_message(EngineDead("engine core process 1001 exited"))
    replicas[0].on_message(EngineDead("engine core process 1000 exited"))
    replicas[0].on_message(_finished("late"))
    assert received == [EngineDead("engine core replica 1 of 2: engine core process 1001 "
                                   "exited")]


def test_info_and_broadcasts():
    client, replicas, _ = _dp(2)
    assert client.info.num_blocks == 99  # a request must fit one replica
    assert client.engine_pids == [1000, 1001]
    client.send(Shutdown())
    assert all(r.sent == [Shutdown()] for r in replicas)


def _config(dp: int, tp: int, device: str = "auto") -> EngineConfig:
    return EngineConfig(model=ModelConfig("m"), parallel=ParallelConfig(tp, 1, dp),
                        device=DeviceConfig(device))


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia/version"),
                    reason="checks the placement where torch sees no GPU")
@pytest.mark.parametrize("visible, dp, tp, rank, expected", [
    ("3,5,6,7", 2, 2, 1, "6,7"),
    ("3,5,6,7", 2, 2, 0, "3,5"),
    (None, 4, 1, 2, "2"),
    ("4,5,6", 2, 1, 1, "5"),
])
def test_each_replica_sees_its_own_gpus(monkeypatch, visible, dp, tp, rank, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    take_devices(_config(dp, tp), rank)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == expected


def test_too_few_visible_gpus_are_named(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    with pytest.raises(ValueError, match="data_parallel_size: 2 replicas of "
                                         "tensor_parallel_size 2 need 4 GPUs; "
                                         "CUDA_VISIBLE_DEVICES names 3"):
        take_devices(_config(2, 2), 0)


def test_cpu_replicas_leave_the_devices_alone(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    take_devices(_config(2, 1, "cpu"), 1)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0"
