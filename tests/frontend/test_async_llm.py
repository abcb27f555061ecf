"""AsyncLLM on a fake engine client (no engine, no model): per-request streams, abort when
the consumer goes away, engine-side rejection, engine death; nothing left behind."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

import msgspec
import pytest

from loom.engine.protocol import (AbortRequests, EngineCoreOutput, EngineCoreOutputs,
                                  EngineCoreRequest, EngineDead, EngineReady, FinishReason,
                                  UtilityCall, UtilityResult)
from loom.frontend.async_llm import AsyncLLM, EngineDeadError, RequestRejectedError
from loom.frontend.core_client import EngineCoreClient
from loom.frontend.request_logger import RequestLogger
from loom.sampling_params import SamplingParams


class FakeClient(EngineCoreClient):
    def __init__(self) -> None:
        self.info = EngineReady(vocab_size=100, max_model_len=64, eos_token_id=None,
                                num_blocks=10, block_size=16)
        self.sent: list = []
        self.deliver = None

    def start(self, on_message) -> None:
        self.deliver = on_message

    def send(self, message) -> None:
        self.sent.append(message)

    async def close(self) -> None:
        pass

    def added(self) -> list[str]:
        return [m.request_id for m in self.sent if isinstance(m, EngineCoreRequest)]

    def aborted(self) -> list[str]:
        return [i for m in self.sent if isinstance(m, AbortRequests) for i in m.request_ids]

    def output(self, rid: str, tokens: list[int], finish=None, error=None) -> None:
        self.deliver(EngineCoreOutputs(outputs=[EngineCoreOutput(rid, tokens, finish_reason=finish,
                                                                 error=error)]))


def _engine() -> tuple[AsyncLLM, FakeClient]:
    client = FakeClient()
    engine = AsyncLLM(client, tokenizer=None)
    engine.start()
    return engine, client


def _idle(engine: AsyncLLM) -> bool:
    return not engine.streams and not engine.output_processor.children


async def _collect(engine, rid, params, feed) -> list:
    outputs = []
    async with aclosing(engine.generate([1, 2, 3], params, rid)) as gen:
        async for out in gen:
            outputs.append(out)
            feed(len(outputs))
    return outputs


def test_deltas_until_finished_then_nothing_left():
    async def main():
        engine, client = _engine()

        def feed(count):
            client.output("r", [10 + count], FinishReason.LENGTH if count == 2 else None)
        task = asyncio.ensure_future(_collect(engine, "r", SamplingParams(max_tokens=3), feed))
        await asyncio.sleep(0)  # let generate send the request
        client.output("r", [10])
        outputs = await task
        assert [o.outputs[0].token_ids for o in outputs] == [[10], [11], [12]]
        assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "length"
        assert client.added() == ["r"] and client.aborted() == []
        assert _idle(engine)
    asyncio.run(main())


def test_cancelled_consumer_aborts_every_child():
    async def main():
        engine, client = _engine()
        task = asyncio.ensure_future(_collect(engine, "r", SamplingParams(n=2, max_tokens=50),
                                              lambda _: None))
        await asyncio.sleep(0)
        client.output("0_r", [5])
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert sorted(client.aborted()) == ["0_r", "1_r"]
        assert _idle(engine)
    asyncio.run(main())


def test_engine_rejection_raises_and_aborts_siblings():
    async def main():
        engine, client = _engine()
        task = asyncio.ensure_future(_collect(engine, "r", SamplingParams(n=2), lambda _: None))
        await asyncio.sleep(0)
        client.output("1_r", [], FinishReason.ERROR, error="request: too big for the KV cache")
        with pytest.raises(RequestRejectedError, match="KV cache"):
            await task
        assert client.aborted() == ["0_r"]
        assert _idle(engine)
    asyncio.run(main())


def test_invalid_request_raises_before_anything_is_sent():
    async def main():
        engine, client = _engine()
        with pytest.raises(ValueError, match="outside the vocabulary"):
            await anext(engine.generate([1, 1000], SamplingParams(), "r"))
        assert client.sent == [] and _idle(engine)
    asyncio.run(main())


def test_engine_death_fails_requests_and_utilities():
    async def main():
        engine, client = _engine()
        task = asyncio.ensure_future(_collect(engine, "r", SamplingParams(), lambda _: None))
        utility = asyncio.ensure_future(engine.call_utility("get_kv_info"))
        await asyncio.sleep(0)
        assert isinstance(client.sent[-1], UtilityCall)
        client.deliver(EngineDead("worker 1 died"))
        with pytest.raises(EngineDeadError, match="worker 1 died"):
            await task
        with pytest.raises(EngineDeadError):
            await utility
        with pytest.raises(EngineDeadError):
            await engine.check_health()
        with pytest.raises(EngineDeadError):
            await anext(engine.generate([1], SamplingParams(), "late"))
        assert client.aborted() == []  # nothing to abort in a dead engine
        assert _idle(engine) and not engine._utility_calls
    asyncio.run(main())


def test_utility_result_and_error():
    async def main():
        engine, client = _engine()
        ok = asyncio.ensure_future(engine.call_utility("get_num_unfinished_requests"))
        bad = asyncio.ensure_future(engine.call_utility("nope"))
        wrong = asyncio.ensure_future(engine.call_utility("get_kv_info", 1))
        await asyncio.sleep(0)
        ids = [m.call_id for m in client.sent]
        client.deliver(EngineCoreOutputs(utility_results=[
            UtilityResult(ids[0], 3), UtilityResult(ids[1], error="ValueError: unknown: x"),
            UtilityResult(ids[2], error="TypeError: takes 1 argument")]))
        assert await ok == 3
        with pytest.raises(ValueError, match="^unknown: x$"):
            await bad
        with pytest.raises(RuntimeError, match="engine utility failed: TypeError: takes 1"):
            await wrong
    asyncio.run(main())


def test_max_logprobs_is_the_engines_and_names_the_field():
    async def main():
        client = FakeClient()
        client.info = msgspec.structs.replace(client.info, max_logprobs=2)
        engine = AsyncLLM(client, tokenizer=None)
        engine.start()
        for name in ("logprobs", "prompt_logprobs"):
            with pytest.raises(ValueError, match=f"^{name}: 3 is more than the engine's "
                                                 r"max_logprobs \(2\)"):
                await anext(engine.generate([1, 2], SamplingParams(**{name: 3}), "r"))
        assert client.sent == [] and _idle(engine)
        engine.processor.process("ok", [1, 2], SamplingParams(logprobs=2, prompt_logprobs=2))
    asyncio.run(main())


def test_requests_are_logged_only_when_asked_and_accepted_and_cut_to_max_log_len(caplog):
    async def main(request_logger):
        client = FakeClient()
        engine = AsyncLLM(client, tokenizer=None, request_logger=request_logger)
        engine.start()
        with pytest.raises(ValueError):  # refused by the Processor: never logged
            await anext(engine.generate([1, 2, 3, 4], SamplingParams(logprobs=99), "r-0"))
        task = asyncio.ensure_future(_collect(engine, "r-1", SamplingParams(max_tokens=1),
                                              lambda _: None))
        await asyncio.sleep(0)  # let generate send the request
        client.output("r-1", [10], FinishReason.LENGTH)
        await task
    with caplog.at_level("INFO"):
        asyncio.run(main(None))
    assert "r-1" not in caplog.text
    with caplog.at_level("INFO"):
        asyncio.run(main(RequestLogger(None, max_log_len=2)))
    assert "r-0" not in caplog.text
    assert [r.getMessage() for r in caplog.records if "r-1" in r.getMessage()] == [
        f"Received request r-1: prompt: None, params: {SamplingParams(max_tokens=1)}, "
        "prompt_token_ids: [1, 2]"]


def test_logged_requests_name_their_lora_adapter(caplog):
    from loom.lora.request import LoRARequest
    lora = LoRARequest("sql", 3, "/adapters/sql")
    with caplog.at_level("INFO"):
        RequestLogger(None).log("r-2", "hi", [1], SamplingParams(max_tokens=1), lora)
        RequestLogger(None).log("r-3", "hi", [1], SamplingParams(max_tokens=1))
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].endswith(f"prompt_token_ids: [1], lora_request: {lora}")
    assert messages[1].endswith("prompt_token_ids: [1]")


def test_priority_reaches_the_engine_and_fcfs_refuses_it():
    async def main():
        engine, client = _engine()
        with pytest.raises(ValueError, match="^priority: .*--scheduling-policy priority"):
            await anext(engine.generate([1, 2], SamplingParams(max_tokens=1), "a", priority=2))
        client.info = EngineReady(100, 64, None, 10, 16, scheduling_policy="priority")
        engine = AsyncLLM(client, tokenizer=None)
        engine.start()
        gen = engine.generate([1, 2], SamplingParams(max_tokens=1, n=2), "b", priority=-1)
        task = asyncio.ensure_future(anext(gen))
        await asyncio.sleep(0)
        requests = [m for m in client.sent if isinstance(m, EngineCoreRequest)]
        assert len(requests) == 2 and {r.priority for r in requests} == {-1}
        task.cancel()  # as a client that goes away: the requests are aborted
        with pytest.raises(asyncio.CancelledError):
            await task
        await gen.aclose()
        assert sorted(client.aborted()) == sorted(r.request_id for r in requests)
    asyncio.run(main())
