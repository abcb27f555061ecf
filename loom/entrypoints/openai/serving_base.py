"""What the completion and chat endpoints share: model names, limits, request ids, logprobs,
SSE framing, and running several prompts' generators at once."""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from loom.beam_search import (BeamSearchParams, BeamSearchSequence, beam_search_async,
                               check_width)
from loom.entrypoints.openai.errors import APIError, error_info, exception_status
from loom.entrypoints.openai.protocol import ErrorResponse, PromptLogprob, PromptLogprobs
from loom.entrypoints.openai.serving_models import ServingModels
from loom.frontend.async_llm import AsyncLLM
from loom.lora.request import LoRARequest
from loom.outputs import PositionLogprobs, RequestOutput


_T = TypeVar("_T")
_TOKENIZER_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="loom-tokenizer")


async def off_loop(fn: Callable[..., _T], *args) -> _T:
    """Run fn (tokenization, the chat template) on the tokenizer thread: a megabyte prompt
    takes seconds, and on the event loop it would stall every stream, /health included.
    One thread, as the tokenizer is not meant to be used from several at once."""
    return await asyncio.get_running_loop().run_in_executor(_TOKENIZER_THREAD,
                                                            functools.partial(fn, *args))


class OpenAIServing:
    def __init__(self, engine: AsyncLLM, models: ServingModels | list[str],
                 sampling_defaults: dict | None = None,
                 prompt_tokens_details: bool = False, *, tokens_as_ids: bool = False,
                 force_include_usage: bool = False, stream_interval: int = 1) -> None:
        self.engine = engine
        self.prompt_tokens_details = prompt_tokens_details
        """--enable-prompt-tokens-details: usage says how many prompt tokens were cached."""
        self.tokens_as_ids = tokens_as_ids
        """--return-tokens-as-token-ids: what a request that leaves return_tokens_as_token_ids
        unset gets."""
        self.force_include_usage = force_include_usage
        """--enable-force-include-usage: every stream ends with a usage chunk, as if it had
        asked for one (stream_options.include_usage)."""
        self.stream_interval = stream_interval
        """--stream-interval: a streamed choice goes out every this many tokens
        (`stream_interval`)."""
        self.models = models if isinstance(models, ServingModels) else ServingModels(models)
        """The base model's names and the LoRA adapters', shared by all endpoints."""
        self.tokenizer = engine.tokenizer
        self.sampling_defaults = sampling_defaults or {}
        """The model's generation_config recommendations for unset sampling fields."""

    async def beam_search(self, prompt_ids: list[int], params: BeamSearchParams,
                          request_id: str, lora_request: LoRARequest | None = None,
                          cache_salt: str | None = None, priority: int = 0
                          ) -> list[BeamSearchSequence]:
        """vLLM's use_beam_search: the n best beams of one prompt (each round's requests
        with the request's adapter, cache salt and priority)."""
        def decode(ids: list[int]) -> str:
            return self.tokenizer.decode(ids) if self.tokenizer is not None else ""
        check_width(params, self.engine.processor.max_logprobs, "use_beam_search",
                    self.engine.logprobs_mode)
        generate = functools.partial(self.engine.generate, cache_salt=cache_salt,
                                     lora_request=lora_request, priority=priority)
        return await beam_search_async(generate, prompt_ids, params,
                                       self.engine.processor.eos_token_id, request_id, decode)

    def resolve_model(self, model: str | None) -> tuple[str, LoRARequest | None]:
        """(the name to answer with, the LoRA adapter to run with): the first served name
        for any of the base model's (as vLLM), an adapter's own; 404 for anything else."""
        return self.models.resolve(model)

    def check_model(self, model: str | None) -> str:
        """The name to answer with, for endpoints where an adapter changes nothing (they
        share the base model's tokenizer)."""
        return self.resolve_model(model)[0]

    @staticmethod
    def new_id(prefix: str, base: str | None = None) -> str:
        """A response's id: prefix-base, a fresh uuid where no base is given (vLLM's: a
        request's request_id or X-Request-Id header)."""
        return f"{prefix}-{base or uuid.uuid4().hex}"

    def max_tokens_for(self, num_prompt_tokens: int, requested: int | None) -> int:
        """The request's max_tokens; a 400 when prompt + output cannot fit the context.
        None (unset in chat, null in completions, whose own default is 16 as in vLLM and
        OpenAI): generation_config's max_new_tokens where it has one, as vLLM; in either case
        no more than the context leaves."""
        limit = self.engine.max_model_len
        if num_prompt_tokens >= limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens; the "
                                f"prompt has {num_prompt_tokens} tokens, which leaves no room "
                                "for output.", "prompt")
        if requested is None:
            default = self.sampling_defaults.get("max_tokens")
            room = limit - num_prompt_tokens
            return room if default is None else min(default, room)
        if num_prompt_tokens + requested > limit:
            raise APIError(400, f"This model's maximum context length is {limit} tokens. However, "
                                f"you requested {num_prompt_tokens + requested} tokens "
                                f"({num_prompt_tokens} in the prompt, {requested} for the "
                                "completion). Please reduce the prompt or max_tokens.", "max_tokens")
        return requested

    def token_text(self, token_id: int, logprobs: PositionLogprobs | None = None,
                   as_id: bool | None = None) -> str:
        """A logprob entry's token; as_id: vLLM's return_tokens_as_token_ids spelling (None:
        the server's default)."""
        if self.tokens_as_ids if as_id is None else as_id:
            return f"token_id:{token_id}"
        entry = logprobs.get(token_id) if logprobs else None
        if entry is not None and entry.decoded_token is not None:
            return entry.decoded_token
        if self.tokenizer is None:
            return f"token_id:{token_id}"
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def prompt_logprobs(self, positions: list[PositionLogprobs | None] | None
                        ) -> PromptLogprobs | None:
        """vLLM's prompt_logprobs field: None at the first position, then each position's
        {token id: logprob, rank, decoded_token}."""
        if positions is None:
            return None
        return [None if p is None else
                {t: PromptLogprob(logprob=lp.logprob, rank=lp.rank,
                                  decoded_token=self.token_text(t, p, False))
                 for t, lp in p.items()}
                for p in positions]


# -- the client going away -------------------------------------------------------------------

async def run_unless_disconnected(request: Request, work: Coroutine) -> Response:
    """Run a handler, cancelling it if the client disconnects first (which aborts its
    requests in the engine). Starlette only watches for that while it streams."""
    handler = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((handler, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        handler.cancel()
        await asyncio.gather(handler, watcher, return_exceptions=True)
    if handler.cancelled():
        return Response(status_code=499)  # nobody is listening
    return handler.result()


async def _disconnected(request: Request) -> None:
    # The body is already read, so the next message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass



# -- server-sent events ---------------------------------------------------------------------

async def stream_from_first(outputs: AsyncIterator[RequestOutput],
                            events: Callable[[RequestOutput], AsyncIterator[str]]
                            ) -> StreamingResponse:
    """An SSE response of events(first output), once the first output is in: errors before
    it (a refused request) still get their HTTP status code."""
    try:
        first = await anext(outputs)
    except BaseException:
        await outputs.aclose()
        raise
    return StreamingResponse(events(first), media_type="text/event-stream")


def sse(model: BaseModel) -> str:
    return f"data: {model.model_dump_json(exclude_none=True)}\n\n"


SSE_DONE = "data: [DONE]\n\n"


def sse_error(exc: BaseException) -> str:
    status, message, param = exception_status(exc)
    return f"data: {ErrorResponse(error=error_info(status, message, param)).model_dump_json()}\n\n"


def json_bytes(value: object) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode()


# -- several prompts at once ------------------------------------------------------------------

async def merge(generators: Sequence[AsyncIterator[RequestOutput]]
                ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(index, output) from all generators as they come. One generator needs no tasks;
    several get one `anext` task each at a time, all cancelled and closed on the way out."""
    if len(generators) == 1:
        async with aclosing(generators[0]) as only:
            async for output in only:
                yield 0, output
        return
    pending: dict[asyncio.Task, int] = {}
    try:
        pending = {asyncio.ensure_future(anext(g)): i for i, g in enumerate(generators)}
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index = pending.pop(task)
                try:
                    output = task.result()
                except StopAsyncIteration:
                    continue
                pending[asyncio.ensure_future(anext(generators[index]))] = index
                yield index, output
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for g in generators:
            await g.aclose()


async def gather_or_cancel(coros: list[Coroutine]) -> list:
    """All results in order; the first failure cancels the rest (aborting them)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
