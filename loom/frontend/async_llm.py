"""`AsyncLLM`: the API server's engine, one async output stream per request.

Tokenization, detokenization, stop strings and n > 1 fan-out happen here, in the API
process (through the same `Processor` and `OutputProcessor` as the offline `LLM`); the
engine core only sees token ids. Engine messages arrive on the event loop thread and are
sorted into per-request queues without any task per request, so a request that ends, in
any way, leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from loom.engine.protocol import (AbortRequests, EngineCoreMessage, EngineCoreOutput,
                                  EngineCoreOutputs, EngineCoreRequest, EngineDead,
                                  SchedulerStats, UtilityCall, UtilityResult)
from loom.frontend.core_client import EngineCoreClient
from loom.frontend.output_processor import OutputKind, OutputProcessor
from loom.frontend.processor import Processor, PromptType
from loom.frontend.request_logger import RequestLogger
from loom.frontend.tokenizer import Tokenizer
from loom.logits_processor import load_classes
from loom.lora.request import LoRARequest
from loom.outputs import (ClassificationOutput, ClassificationRequestOutput, EmbeddingOutput,
                          EmbeddingRequestOutput, RequestOutput)
from loom.pooling_params import PoolingParams
from loom.sampling_params import SamplingParams
from loom.scoring import finish_logits

if TYPE_CHECKING:  # OpenTelemetry is optional: loom.tracing is imported only with the flag
    from loom.tracing import RequestTrace, RequestTracer

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine core is gone; no request can complete."""


class RequestRejectedError(ValueError):
    """The engine core refused a request as invalid."""


class StatsSink(Protocol):
    """Where AsyncLLM reports what /metrics shows."""

    def on_scheduler_stats(self, stats: SchedulerStats) -> None: ...

    def on_first_token(self, seconds: float) -> None: ...

    def on_inter_token(self, seconds: float) -> None: ...

    def on_finished(self, e2e_seconds: float, finish_reason: str) -> None: ...

    def on_queued(self, seconds: float) -> None: ...

    def on_prefill(self, seconds: float) -> None: ...


@dataclass
class _Stream:
    """One request's outputs, waiting for its generator to take them."""
    arrival: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    last_token_time: float | None = None
    trace: RequestTrace | None = None


class AsyncLLM:
    def __init__(self, client: EngineCoreClient, tokenizer: Tokenizer | None,
                 stats: StatsSink | None = None,
                 on_dead: Callable[[str], None] | None = None,
                 tracer: RequestTracer | None = None,
                 request_logger: RequestLogger | None = None) -> None:
        self.client = client
        self.tokenizer = tokenizer
        info = client.info
        self.max_model_len = info.max_model_len
        self.vocab_size = info.vocab_size
        self.tasks = info.tasks
        """What the model serves (`loom.tasks`); the server routes by it."""
        self.logprobs_mode = info.logprobs_mode
        self.processor = Processor(tokenizer, info.max_model_len, info.vocab_size,
                                   info.eos_token_id, info.max_logprobs, info.lora,
                                   info.scheduling_policy, info.tasks,
                                   load_classes(info.logits_processors))
        self.output_processor = OutputProcessor(tokenizer)
        self.streams: dict[str, _Stream] = {}
        self._pooling: dict[str, asyncio.Future] = {}
        """Embedding requests in the engine -> the future of their pooled vector."""
        self._utility_calls: dict[int, asyncio.Future] = {}
        self._call_ids = itertools.count()
        self._stats = stats
        self._on_dead = on_dead
        self._tracer = tracer
        self._request_logger = request_logger
        self.dead_reason: str | None = None

    def start(self) -> None:
        self.client.start(self._on_message)

    @property
    def errored(self) -> bool:
        return self.dead_reason is not None

    # -- requests -------------------------------------------------------------------------

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """(text, token ids) of a prompt given as text or as token ids."""
        if isinstance(prompt, str) and self.tokenizer is None:
            raise ValueError("prompt: text prompts need a tokenizer; send token ids")
        return self.processor.tokenize(prompt)

    async def generate(self, prompt: PromptType, params: SamplingParams, request_id: str,
                       trace_headers: Mapping[str, str] | None = None,
                       cache_salt: str | None = None,
                       lora_request: LoRARequest | None = None,
                       priority: int = 0) -> AsyncIterator[RequestOutput]:
        """Yield what is new for the request at each engine step (text, tokens, logprobs),
        until it finishes. Closing the generator early aborts the request in the engine.
        With tracing on, its span is parented to trace_headers' W3C trace context.
        lora_request: the LoRA adapter it runs with (None: the base model).
        priority: vLLM's; lower values are served first (--scheduling-policy priority)."""
        self._check_alive()
        if request_id in self.streams:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        text, prompt_ids = self.tokenize(prompt)
        # Validated before any state; its ids are the prompt's after truncate_prompt_tokens.
        request = self.processor.process(request_id, prompt_ids, params, cache_salt,
                                         lora_request, priority)
        # Logged once accepted, so that a request the Processor refuses is in the log from
        # neither endpoint (completions checks its prompts before it gets here).
        if self._request_logger is not None:
            self._request_logger.log(request_id, text, prompt_ids, params, lora_request)
        prompt_ids = request.prompt_token_ids
        stream = self.streams[request_id] = _Stream(arrival=time.monotonic())
        if self._tracer is not None:
            stream.trace = self._tracer.begin(request_id, params, len(prompt_ids), trace_headers)
        try:
            children = self.output_processor.add_request(request_id, text, prompt_ids, params,
                                                         OutputKind.DELTA)
            for child_id, child_params in children:
                self.client.send(self.processor.process(child_id, prompt_ids, child_params,
                                                        cache_salt, lora_request, priority))
            said = (self._request_logger if self._request_logger is not None
                    and self._request_logger.log_outputs else None)
            outputs: dict[int, tuple[str, list[int]]] = {}
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if said is not None:
                    _log_outputs(said, item, outputs)
                yield item
                if item.finished:
                    return
        finally:
            self._forget(request_id)
            if stream.trace is not None:
                stream.trace.end()

    async def encode(self, prompt: PromptType, params: PoolingParams,
                     request_id: str) -> EmbeddingRequestOutput:
        """Pool the prompt's hidden states; cancelling the call aborts it in the engine."""
        request, pooled = await self.pool(prompt, params, request_id)
        return EmbeddingRequestOutput(request_id, EmbeddingOutput(pooled),
                                      request.prompt_token_ids)

    async def classify(self, prompt: PromptType, params: PoolingParams,
                       request_id: str) -> ClassificationRequestOutput:
        """A classifier's probabilities for the prompt (params.task classify or score: the
        activation of that task, `loom.scoring.finish_logits`)."""
        request, logits = await self.pool(prompt, params, request_id)
        probs = finish_logits(logits, self.tasks, request.pooling_params)
        return ClassificationRequestOutput(request_id, ClassificationOutput(probs),
                                           request.prompt_token_ids)

    async def pool(self, prompt: PromptType, params: PoolingParams,
                   request_id: str) -> tuple[EngineCoreRequest, list[float]]:
        """Run a pooling request: (the request as sent, what the engine pooled). Cancelling
        the call aborts it in the engine."""
        self._check_alive()
        if request_id in self.streams or request_id in self._pooling:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        text, prompt_ids = self.tokenize(prompt)
        request = self.processor.process_pooling(request_id, prompt_ids, params)
        if self._request_logger is not None:  # once accepted, as generate
            self._request_logger.log(request_id, text, prompt_ids, params)
        future = self._pooling[request_id] = asyncio.get_running_loop().create_future()
        arrival = time.monotonic()
        try:
            self.client.send(request)
            pooled = await future
        finally:
            if self._pooling.pop(request_id, None) is not None and not self.errored:
                self.client.send(AbortRequests([request_id]))
        if self._stats is not None:  # a pooling request ends with its one output
            self._stats.on_finished(time.monotonic() - arrival, "stop")
        return request, pooled

    def _pooling_done(self, out: EngineCoreOutput) -> None:
        future = self._pooling.pop(out.request_id)
        if future.done():
            return
        if out.error is not None:
            future.set_exception(RequestRejectedError(out.error))
        elif out.pooled is None:
            future.set_exception(RuntimeError(f"request {out.request_id} ended "
                                              f"({out.finish_reason}) without a pooled vector"))
        else:
            future.set_result(out.pooled)

    def _forget(self, request_id: str) -> None:
        """Drop a request's state; abort whatever of it the engine still runs."""
        self.streams.pop(request_id, None)
        engine_ids = self.output_processor.abort([request_id])
        if engine_ids and not self.errored:
            self.client.send(AbortRequests(engine_ids))

    # -- utilities and health -------------------------------------------------------------

    async def call_utility(self, method: str, *args) -> object:
        """Call an EngineCore utility method (get_kv_info, reset_prefix_cache, ...)."""
        self._check_alive()
        call_id = next(self._call_ids)
        future = self._utility_calls[call_id] = asyncio.get_running_loop().create_future()
        try:
            self.client.send(UtilityCall(call_id, method, list(args)))
            return await future
        finally:
            self._utility_calls.pop(call_id, None)

    async def check_health(self) -> None:
        self._check_alive()

    def _check_alive(self) -> None:
        if self.dead_reason is not None:
            raise EngineDeadError(self.dead_reason)

    async def close(self) -> None:
        await self.client.close()

    # -- engine messages (on the event loop thread) ----------------------------------------

    def _on_message(self, message: EngineCoreMessage) -> None:
        if isinstance(message, EngineDead):
            self._engine_died(message.reason)
            return
        assert isinstance(message, EngineCoreOutputs)
        for result in message.utility_results:
            self._utility_done(result)
        if message.scheduler_stats is not None and self._stats is not None:
            self._stats.on_scheduler_stats(message.scheduler_stats)
        if message.outputs:
            self._process(message.outputs, message.timestamp)

    def _process(self, outputs: list[EngineCoreOutput], timestamp: float) -> None:
        accepted = []
        for out in outputs:
            if out.queue_time_s is not None or out.prefill_time_s is not None:
                self._record_engine_times(out)
            if out.request_id in self._pooling:
                self._pooling_done(out)
            elif out.error is not None:
                self._reject(out)
            else:
                accepted.append(out)
        ready, to_abort = self.output_processor.process_outputs(accepted)
        if to_abort:
            self.client.send(AbortRequests(to_abort))  # stop strings
        now = time.monotonic()
        for output in ready:
            stream = self.streams.get(output.request_id)
            if stream is not None:
                self._record(stream, output, now)
                if stream.trace is not None:
                    stream.trace.observe(output, now)
                stream.queue.put_nowait(output)

    def _record_engine_times(self, out: EngineCoreOutput) -> None:
        """The engine's queue and prefill times (each on one output of the request)."""
        if self._stats is not None:
            if out.queue_time_s is not None:
                self._stats.on_queued(out.queue_time_s)
            if out.prefill_time_s is not None:
                self._stats.on_prefill(out.prefill_time_s)
        child = self.output_processor.children.get(out.request_id)
        stream = self.streams.get(child.parent.request_id if child else out.request_id)
        if stream is None or stream.trace is None:
            return
        trace = stream.trace  # n > 1: the first child's times
        if trace.queue_time is None and out.queue_time_s is not None:
            trace.queue_time = out.queue_time_s
        if trace.prefill_time is None and out.prefill_time_s is not None:
            trace.prefill_time = out.prefill_time_s

    def _reject(self, out: EngineCoreOutput) -> None:
        child = self.output_processor.children.get(out.request_id)
        if child is None:
            return
        parent_id = child.parent.request_id
        siblings = [i for i in self.output_processor.abort([parent_id]) if i != out.request_id]
        if siblings:
            self.client.send(AbortRequests(siblings))
        stream = self.streams.get(parent_id)
        if stream is not None:
            stream.queue.put_nowait(RequestRejectedError(out.error))

    def _record(self, stream: _Stream, output: RequestOutput, now: float) -> None:
        if self._stats is None:
            return
        if any(c.token_ids for c in output.outputs):
            if stream.last_token_time is None:
                self._stats.on_first_token(now - stream.arrival)
            else:
                self._stats.on_inter_token(now - stream.last_token_time)
            stream.last_token_time = now
        if output.finished:
            reasons = {c.finish_reason for c in output.outputs if c.finish_reason}
            self._stats.on_finished(now - stream.arrival, min(reasons) if reasons else "stop")

    def _utility_done(self, result: UtilityResult) -> None:
        future = self._utility_calls.get(result.call_id)
        if future is None or future.done():
            return
        if result.error is not None:  # a ValueError is the call's bad input, as it was raised
            kind, _, message = result.error.partition(": ")
            # (a method loom lacks, such as reloading a quantized model, is bad input too)
            future.set_exception(ValueError(message) if kind in ("ValueError",
                                                                 "NotImplementedError") else
                                 RuntimeError(f"engine utility failed: {result.error}"))
        else:
            future.set_result(result.result)

    def _engine_died(self, reason: str) -> None:
        if self.dead_reason is not None:
            return
        logger.error("engine core is dead: %s", reason)
        self.dead_reason = reason
        for stream in self.streams.values():
            stream.queue.put_nowait(EngineDeadError(reason))
        for future in [*self._utility_calls.values(), *self._pooling.values()]:
            if not future.done():
                future.set_exception(EngineDeadError(reason))
        if self._on_dead is not None:
            self._on_dead(reason)


def _log_outputs(said: RequestLogger, item: RequestOutput,
                 outputs: dict[int, tuple[str, list[int]]]) -> None:
    """--enable-log-outputs: gather each completion's deltas; log it once it finishes."""
    for delta in item.outputs:
        text, ids = outputs.get(delta.index, ("", []))
        outputs[delta.index] = (text + delta.text, ids + list(delta.token_ids))
        if delta.finish_reason is not None:
            said.log_output(item.request_id, delta.index, *outputs.pop(delta.index),
                            delta.finish_reason)
