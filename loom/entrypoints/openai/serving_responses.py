"""POST /v1/responses (whole or streamed), GET /v1/responses/{id} and POST
/v1/responses/{id}/cancel, as vLLM serves OpenAI's Responses API.

A response runs as a chat completion does, through the chat path's pieces: the input items
become chat messages (after the instructions, as a system message, and the stored
conversation of `previous_response_id`), rendered by the chat template; the request's
tools, tool_choice and text.format become the template's tools, the tool-call parser or a
constraint, and structured output; the server's --reasoning-parser splits off the thinking.
What differs is the shape: output items, usage and OpenAI's stream events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse, Response, StreamingResponse

from loom.entrypoints.openai.errors import APIError, error_info, exception_status
from loom.entrypoints.openai.protocol_chat import ChatMessage, TokenLogprob
from loom.entrypoints.openai.protocol_responses import (ReasoningConfig, ResponsesRequest,
                                                        TextConfig)
from loom.entrypoints.openai.protocol_responses_output import (
    ErrorEvent, IncompleteDetails, LifecycleEvent, OutputItem, OutputMessage, ResponseObject,
    ResponseUsage, StreamEvent, new_item_id, sse_event)
from loom.entrypoints.openai.responses_background import BackgroundRun
from loom.entrypoints.openai.responses_input import to_messages
from loom.entrypoints.openai.responses_store import ENV, ResponseStore, StoredResponse
from loom.entrypoints.openai.output_split import OutputSplit, SplitStream
from loom.entrypoints.openai.responses_stream import ResponseEvents, output_items
from loom.entrypoints.openai.serving_base import OpenAIServing, off_loop, stream_from_first
from loom.entrypoints.openai.serving_chat import OpenAIServingChat
from loom.entrypoints.openai.stream_interval import Interval
from loom.entrypoints.openai.tool_calls import ToolCalls
from loom.frontend.processor import check_num_logprobs
from loom.outputs import CompletionOutput, RequestOutput
from loom.sampling_params import SamplingParams


def _error_code(status: int) -> str:
    """The OpenAI error type of an HTTP status: a failed response's error code."""
    return error_info(status, "").type


@dataclass
class _Output:
    """What a response's request generated so far."""
    text: str = ""
    tokens: int = 0
    marks: list[tuple[int, int]] = field(default_factory=list)
    """(length of text, tokens so far) after each piece: where tokens end in the text."""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    """A whole response's (a stream's go out with its text)."""
    finish_reason: str | None = None
    cached_tokens: int = 0

    def add(self, output: RequestOutput, delta: CompletionOutput) -> None:
        """Record one engine output's delta, as it comes (so marks are per step)."""
        self.cached_tokens = max(self.cached_tokens, output.num_cached_tokens)
        self.text += delta.text
        self.tokens += len(delta.token_ids)
        self.marks.append((len(self.text), self.tokens))
        self.finish_reason = delta.finish_reason or self.finish_reason

    def tokens_within(self, end: int) -> int:
        """How many tokens make up the text's first `end` characters (0 for none)."""
        return max((n for length, n in self.marks if length <= end), default=0) if end else 0

    @property
    def incomplete(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class _Run:
    """One response being generated."""
    id: str
    model: str
    body: ResponsesRequest
    params: SamplingParams
    prompt_tokens: int
    split: OutputSplit
    conversation: list[ChatMessage]
    """The turns this response answers, without its instructions (what a continuation of it
    starts from, with its output)."""
    store: bool
    created_at: int = field(default_factory=lambda: int(time.time()))
    out: _Output = field(default_factory=_Output)
    error: tuple[int, str, str | None] | None = None
    """(status, message, param) of an error after its stream began."""


class OpenAIServingResponses(OpenAIServing):
    def __init__(self, chat: OpenAIServingChat, store: ResponseStore | None = None) -> None:
        """chat: the server's chat endpoint, whose template, tool-call parser and reasoning
        parser a response runs with; store: None unless LOOM_ENABLE_RESPONSES_API_STORE."""
        super().__init__(chat.engine, chat.models, chat.sampling_defaults,
                         chat.prompt_tokens_details, stream_interval=chat.stream_interval)
        self.chat = chat
        self.store = store
        self._background: dict[str, BackgroundRun] = {}
        """The background responses still running, by id."""

    async def create(self, body: ResponsesRequest,
                     trace_headers: Mapping[str, str] | None = None) -> Response:
        model, lora = self.resolve_model(body.model)
        check_num_logprobs("top_logprobs", body.top_logprobs, self.engine.processor.max_logprobs)
        earlier = self._stored(body.previous_response_id, "previous_response_id")
        tools = ToolCalls.for_request(body.chat_tools, body.chat_tool_choice,
                                      body.parallel_tool_calls, self.chat.tool_call_parser)
        conversation = (earlier.conversation if earlier else []) + body.messages
        instructions = ([ChatMessage(role="system", content=body.instructions)]
                        if body.instructions else [])
        prompt_ids = await off_loop(self.chat.render, instructions + conversation, True, False,
                                    body.template_variables(), None)
        # a rendered chat is tokenized without added special tokens: cut plainly
        prompt_ids = self.engine.processor.truncate(prompt_ids, body.truncate_prompt_tokens,
                                                    False)
        if body.truncation == "auto":
            prompt_ids = self.engine.processor.truncate(
                prompt_ids, self._auto_keep(body.max_output_tokens), False)
        params = body.to_sampling_params(self._max_tokens(len(prompt_ids), body.max_output_tokens),
                                         self.sampling_defaults)
        reasoning = self.chat.reasoning_parser  # as chat: none under a constraint it would eat
        if params.guided_decoding is not None and reasoning and reasoning.opened_by_template:
            reasoning = None
        if tools.keeps_special_tokens:
            params.skip_special_tokens = False  # the parser reads the call markers
        run = _Run(new_item_id("resp"), model, body, params, len(prompt_ids),
                   OutputSplit(tools, reasoning), conversation,
                   body.store and self.store is not None)
        if body.background and not run.store:
            raise APIError(400, "background: a background response must be stored: leave "
                                f"store on and start the server with {ENV}=1", "background")
        outputs = self.engine.generate(prompt_ids, params, run.id, trace_headers,
                                       body.cache_salt, lora_request=lora, priority=body.priority)
        if body.background:
            return self._start_background(run, outputs)
        if body.stream:
            return await self._stream(run, outputs)
        return await self._whole(run, outputs)

    async def retrieve(self, response_id: str, stream: bool = False,
                       starting_after: int | None = None) -> Response:
        entry = self._stored(response_id, "response_id")
        if not stream:
            return JSONResponse(entry.response.model_dump(mode="json"))
        if not entry.response.background:
            raise APIError(400, "stream: only a background response can be streamed again",
                           "stream")
        run = self._background.get(response_id)
        if run is not None:
            return StreamingResponse(run.follow(starting_after), media_type="text/event-stream")
        final = LifecycleEvent(type=f"response.{entry.response.status}",
                               response=entry.response)  # it has ended: its final state
        return StreamingResponse(iter([sse_event(final)]), media_type="text/event-stream")

    async def cancel(self, response_id: str) -> Response:
        """As OpenAI: a running background response stops (cancelled); one that has ended
        is returned as it is; a synchronous one is a 400 (vLLM's message)."""
        entry = self._stored(response_id, "response_id")
        run = self._background.get(response_id)
        if run is not None:
            run.task.cancel()
            await asyncio.gather(run.task, return_exceptions=True)
            entry = self._stored(response_id, "response_id")
        elif not entry.response.background:
            raise APIError(400, "Cannot cancel a synchronous response.", "response_id")
        return JSONResponse(entry.response.model_dump(mode="json"))

    async def stop_background(self) -> None:
        """At shutdown: the background responses still running end cancelled."""
        tasks = [run.task for run in self._background.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start_background(self, run: _Run, outputs: AsyncIterator[RequestOutput]) -> Response:
        """Store the response queued and generate it in a task of its own; answer with the
        queued response, or (stream) with its events as they come."""
        background = BackgroundRun()
        queued = self._put_state(run, "queued")
        self._background[run.id] = background
        background.task = asyncio.get_running_loop().create_task(
            self._run_background(run, outputs, background))
        if run.body.stream:
            return StreamingResponse(background.follow(), media_type="text/event-stream")
        return JSONResponse(queued.model_dump(mode="json"))

    async def _run_background(self, run: _Run, outputs: AsyncIterator[RequestOutput],
                              background: BackgroundRun) -> None:
        try:
            try:
                first = await anext(outputs)
            except BaseException:
                await outputs.aclose()
                raise
            self._put_state(run, "in_progress")
            async for event in self._events(run, first, outputs):
                background.add(event)
            if run.error is not None:
                self._put_state(run, "failed", run.error)
        except asyncio.CancelledError:
            self._put_state(run, "cancelled")
        except Exception as e:  # noqa: BLE001 - refused before it began: failed, said in-band
            run.error = exception_status(e)
            self._put_state(run, "failed", run.error)
            background.add(sse_event(ErrorEvent(
                sequence_number=len(background.events), code=_error_code(run.error[0]),
                message=run.error[1], param=run.error[2])))
        finally:
            background.close()
            self._background.pop(run.id, None)

    def _put_state(self, run: _Run, status: str,
                   error: tuple[int, str, str | None] | None = None) -> ResponseObject | None:
        """Store a background response's state and return it, unless it has already ended
        (its final response stored: None)."""
        entry = self.store.get(run.id)
        if entry is not None and entry.response.status not in ("queued", "in_progress"):
            return None
        response = self._response(run, status, [], None)
        if error is not None:
            response.error = {"code": _error_code(error[0]), "message": error[1]}
        self.store.put(StoredResponse.of(response, run.conversation))
        return response

    def _stored(self, response_id: str | None, param: str) -> StoredResponse | None:
        if response_id is None:
            return None
        entry = self.store.get(response_id) if self.store is not None else None
        if entry is None:
            hint = ("" if self.store is not None else
                    f" This server keeps no responses: start it with {ENV}=1.")
            raise APIError(404, f"Response with id '{response_id}' not found.{hint}", param)
        return entry

    def _auto_keep(self, max_output_tokens: int | None) -> int:
        """truncation "auto" (vLLM's): the input tokens kept, the context less the output
        asked for (one token where none is asked)."""
        keep = self.engine.max_model_len - (max_output_tokens or 1)
        if keep < 1:
            raise APIError(400, f"max_output_tokens {max_output_tokens} leaves no room for "
                                f"the input in max_model_len {self.engine.max_model_len} "
                                "(truncation: \"auto\")", "max_output_tokens")
        return keep

    def _max_tokens(self, prompt_tokens: int, requested: int | None) -> int:
        """As vLLM: max_output_tokens within what the context leaves, unset: all of it (or
        generation_config's max_new_tokens); a prompt that fills the context is a 400."""
        try:
            default = self.max_tokens_for(prompt_tokens, None)
        except APIError as e:
            raise APIError(e.status, e.message, "input") from None
        return default if requested is None else min(requested,
                                                     self.engine.max_model_len - prompt_tokens)

    async def _whole(self, run: _Run, outputs: AsyncIterator[RequestOutput]) -> Response:
        async with aclosing(outputs):
            async for output in outputs:
                for delta in output.outputs:
                    run.out.add(output, delta)
                    # chat's logprobs, on fields both bodies have
                    run.out.logprobs += self.chat.token_logprobs(delta, run.body)
        thinking, content, calls, _ = run.split.whole(run.out.text, run.out.finish_reason)
        items = output_items(thinking, content, calls, run.out.logprobs, run.out.incomplete)
        return JSONResponse(self._finish(run, items).model_dump(mode="json"))

    async def _stream(self, run: _Run, outputs: AsyncIterator[RequestOutput]) -> Response:
        return await stream_from_first(outputs, lambda first: self._events(run, first, outputs))

    async def _events(self, run: _Run, first: RequestOutput,
                      outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[str]:
        events, stream = ResponseEvents(), run.split.stream()
        interval = Interval(self.stream_interval)
        pending: list[TokenLogprob] = []
        try:
            start = self._response(run, "in_progress", [], None)
            for kind in ("response.created", "response.in_progress"):
                yield sse_event(events.event(LifecycleEvent, kind, response=start))
            async with aclosing(outputs):
                output: RequestOutput | None = first
                while output is not None:
                    for event in self._step(run, output, stream, events, pending, interval):
                        yield sse_event(event)
                    output = await anext(outputs, None)
            if pending and isinstance(events.current, OutputMessage):
                events.current.content[0].logprobs += pending  # held back, not sent as text
            for event in events.close("incomplete" if run.out.incomplete else "completed"):
                yield sse_event(event)
            response = self._finish(run, events.items)
            kind = f"response.{response.status}"
            yield sse_event(events.event(LifecycleEvent, kind, response=response))
        except Exception as e:  # noqa: BLE001 - the status is sent; say what went wrong in-band
            status, message, param = run.error = exception_status(e)
            yield sse_event(events.event(ErrorEvent, "error", code=_error_code(status),
                                         message=message, param=param))

    def _step(self, run: _Run, output: RequestOutput, stream: SplitStream,
              events: ResponseEvents, pending: list[TokenLogprob],
              interval: Interval) -> list[StreamEvent]:
        """The events for one engine output (none while --stream-interval holds it back).
        Logprobs go out with the text after them."""
        sent: list[StreamEvent] = []
        for delta in output.outputs:
            run.out.add(output, delta)
            delta = interval.take(delta)
            if delta is None:
                continue
            pending += self.chat.token_logprobs(delta, run.body)
            thinking, content, calls, _ = stream.feed(delta.text,
                                                      "stop" if delta.finished else None)
            if thinking:
                sent += events.reasoning(thinking)
            if content:
                sent += events.text(content, pending[:])
                pending.clear()
            for call in calls:
                sent += events.call(call)
        return sent

    def _finish(self, run: _Run, items: list[OutputItem]) -> ResponseObject:
        """The finished response (stored, if it is to be)."""
        out = run.out
        usage = ResponseUsage.of(run.prompt_tokens, out.tokens, out.cached_tokens,
                                 out.tokens_within(run.split.reasoning_end(out.text)))
        response = self._response(run, "incomplete" if out.incomplete else "completed", items,
                                  usage)
        if run.store:
            said = [ChatMessage.model_validate(m) for m in to_messages(
                [item.model_dump() for item in items], "output")]
            self.store.put(StoredResponse.of(response, run.conversation + said))
        return response

    @staticmethod
    def _response(run: _Run, status: str, items: list[OutputItem],
                  usage: ResponseUsage | None) -> ResponseObject:
        """The response object: its output, and the request's settings as OpenAI echoes them."""
        body = run.body
        return ResponseObject(
            id=run.id, created_at=run.created_at, status=status, background=body.background,
            model=run.model, output=items,
            usage=usage, incomplete_details=(IncompleteDetails(reason="max_output_tokens")
                                             if status == "incomplete" else None),
            instructions=body.instructions, max_output_tokens=body.max_output_tokens,
            max_tool_calls=body.max_tool_calls, metadata=body.metadata or {},
            parallel_tool_calls=body.parallel_tool_calls,
            previous_response_id=body.previous_response_id,
            reasoning=(body.reasoning or ReasoningConfig()).model_dump(),
            service_tier=body.service_tier, store=run.store, temperature=run.params.temperature,
            top_p=run.params.top_p, text=(body.text or TextConfig()).model_dump(
                by_alias=True, exclude_none=True), tool_choice=body.tool_choice,
            tools=[t.model_dump() for t in body.tools], top_logprobs=body.top_logprobs,
            truncation=body.truncation or "disabled", user=body.user)
