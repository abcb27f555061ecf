"""POST /v1/completions: one or more prompts (text or token ids), n choices each, echo and
logprobs (prompt logprobs when echoed, as lm-eval's local-completions reads them), streamed
or whole."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass, field

from fastapi.responses import JSONResponse, Response

from loom.entrypoints.openai.protocol import UsageInfo
from loom.entrypoints.openai.protocol_completions import (CompletionChoice, CompletionLogprobs,
                                                          CompletionRequest, CompletionResponse)
from loom.entrypoints.openai.serving_base import (SSE_DONE, OpenAIServing, gather_or_cancel,
                                                  merge, off_loop, sse, sse_error,
                                                  stream_from_first)
from loom.entrypoints.openai.stream_interval import every
from loom.lora.request import LoRARequest
from loom.outputs import CompletionOutput, PositionLogprobs, RequestOutput


@dataclass
class _Prompt:
    text: str | None
    token_ids: list[int]
    cached_tokens: int = 0

    def seen(self, output: RequestOutput) -> None:
        self.cached_tokens = max(self.cached_tokens, output.num_cached_tokens)


@dataclass
class _Choice:
    """A choice as it grows over the deltas (whole responses) or as far as streamed."""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs | None] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    text_offset: int = 0
    started: bool = False

    def add(self, delta: CompletionOutput) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        self.logprobs += delta.logprobs or []
        self.finish_reason = delta.finish_reason
        self.stop_reason = delta.stop_reason


@dataclass
class _Request:
    id: str
    model: str
    created: int
    body: CompletionRequest
    prompts: list[_Prompt]
    lora: LoRARequest | None = None
    """The LoRA adapter `model` named; None: the base model."""


class OpenAIServingCompletion(OpenAIServing):
    async def create(self, body: CompletionRequest,
                     trace_headers: Mapping[str, str] | None = None,
                     header_id: str | None = None) -> Response:
        """header_id: the request's X-Request-Id header, the id's base before request_id."""
        model, lora = self.resolve_model(body.model)
        request = _Request(self.new_id("cmpl", header_id or body.request_id), model,
                           int(time.time()), body, [], lora)
        generators = []
        tokenized = await off_loop(lambda: [self.engine.tokenize(p) for p in body.prompts])
        for i, (text, token_ids) in enumerate(tokenized):
            kept = self.engine.processor.truncate(token_ids, body.truncate_prompt_tokens,
                                                  text is not None)
            text, token_ids = (text, token_ids) if kept is token_ids else (None, kept)
            params = body.to_sampling_params(self.max_tokens_for(len(token_ids), body.max_tokens),
                                             self.sampling_defaults)
            # All valid, or none runs.
            self.engine.processor.process(request.id, token_ids, params, body.cache_salt,
                                          lora_request=lora, priority=body.priority)
            request.prompts.append(_Prompt(text, token_ids))
            generators.append((token_ids, params, f"{request.id}-{i}"))
        if body.use_beam_search:
            return await self._beam_search(request, [g[0] for g in generators])
        interval = self.stream_interval if body.stream else 1
        outputs = merge([every(self.engine.generate(*g, trace_headers, body.cache_salt,
                                                    lora_request=lora, priority=body.priority),
                               interval)
                         for g in generators])
        if body.stream:
            return await self._stream(request, outputs)
        return await self._whole(request, outputs)

    # -- whole response ---------------------------------------------------------------------

    async def _whole(self, request: _Request, outputs: AsyncIterator) -> Response:
        n = request.body.n
        choices = [_Choice() for _ in range(len(request.prompts) * n)]
        prompt_logprobs: dict[int, list] = {}
        async with aclosing(outputs):
            async for i, output in outputs:
                request.prompts[i].seen(output)
                if output.prompt_logprobs is not None:
                    prompt_logprobs[i] = output.prompt_logprobs
                for delta in output.outputs:
                    choices[i * n + delta.index].add(delta)
        result = [self._finish_choice(request, k, c, prompt_logprobs.get(k // n))
                  for k, c in enumerate(choices)]
        response = CompletionResponse(id=request.id, created=request.created, model=request.model,
                                      choices=result, usage=self._usage(request, choices))
        return JSONResponse(response.model_dump(mode="json"))

    def _finish_choice(self, request: _Request, index: int, choice: _Choice,
                       prompt_logprobs: list | None) -> CompletionChoice:
        prompt = request.prompts[index // request.body.n]
        text, token_ids, positions = choice.text, choice.token_ids, choice.logprobs
        if request.body.echo:
            text = self._echo_text(prompt) + text
            token_ids = prompt.token_ids + token_ids
            positions = self._prompt_positions(prompt, prompt_logprobs) + positions
        logprobs = (self._logprobs(token_ids, positions, 0, request.body.return_tokens_as_token_ids)
                    if request.body.logprobs is not None else None)
        asked = request.body.prompt_logprobs is not None
        return CompletionChoice(index=index, text=text, logprobs=logprobs,
                                finish_reason=choice.finish_reason, stop_reason=choice.stop_reason,
                                prompt_logprobs=self.prompt_logprobs(prompt_logprobs) if asked
                                else None, **_ids(request.body, prompt, choice.token_ids))

    async def _beam_search(self, request: _Request, prompts: list[list[int]]) -> Response:
        body = request.body
        searches = [self.beam_search(ids, body.beam_search_params(
            self.max_tokens_for(len(ids), body.max_tokens)), f"{request.id}-{i}", request.lora,
            body.cache_salt, body.priority) for i, ids in enumerate(prompts)]
        results = await gather_or_cancel(searches)
        choices, generated = [], 0
        for i, (prompt, beams) in enumerate(zip(request.prompts, results)):
            echo = self._echo_text(prompt) if body.echo else ""
            for k, beam in enumerate(beams):
                ids = beam.tokens[len(prompt.token_ids):]
                generated += len(ids)
                choices.append(CompletionChoice(index=i * body.n + k, text=echo + beam.text,
                                                finish_reason=beam.finish_reason,
                                                **_ids(body, prompt, ids)))
        usage = UsageInfo.of(sum(len(p.token_ids) for p in request.prompts), generated)
        response = CompletionResponse(id=request.id, created=request.created,
                                      model=request.model, choices=choices, usage=usage)
        return JSONResponse(response.model_dump(mode="json"))

    # -- stream -------------------------------------------------------------------------------

    async def _stream(self, request: _Request, outputs: AsyncIterator) -> Response:
        return await stream_from_first(outputs,
                                       lambda first: self._events(request, first, outputs))

    async def _events(self, request: _Request, first, outputs: AsyncIterator) -> AsyncIterator[str]:
        n = request.body.n
        choices = [_Choice() for _ in range(len(request.prompts) * n)]
        try:
            async with aclosing(outputs):
                item = first
                while item is not None:
                    request.prompts[item[0]].seen(item[1])
                    for chunk in self._chunks(request, choices, *item):
                        yield chunk
                    item = await anext(outputs, None)
            if request.body.include_usage or self.force_include_usage:
                yield sse(CompletionResponse(id=request.id, created=request.created,
                                             model=request.model, choices=[],
                                             usage=self._usage(request, choices)))
        except Exception as e:  # noqa: BLE001 - the status is sent; say what went wrong in-band
            yield sse_error(e)
        yield SSE_DONE

    def _chunks(self, request: _Request, choices: list[_Choice], i: int, output: RequestOutput):
        body = request.body
        for delta in output.outputs:
            index = i * body.n + delta.index
            choice = choices[index]
            text, token_ids, positions = delta.text, delta.token_ids, delta.logprobs or []
            prompt, first = request.prompts[i], not choice.started
            if first and body.echo:
                text = self._echo_text(prompt) + text
                token_ids = prompt.token_ids + token_ids
                positions = self._prompt_positions(prompt, output.prompt_logprobs) + positions
            choice.add(delta)
            if not text and not token_ids and delta.finish_reason is None:
                continue
            choice.started = True
            logprobs = None
            if body.logprobs is not None:
                logprobs = self._logprobs(token_ids, positions, choice.text_offset,
                                          body.return_tokens_as_token_ids)
                choice.text_offset += sum(len(t) for t in logprobs.tokens)
            yield sse(CompletionResponse(
                id=request.id, created=request.created, model=request.model,
                choices=[CompletionChoice(index=index, text=text, logprobs=logprobs,
                                          finish_reason=delta.finish_reason,
                                          stop_reason=delta.stop_reason,
                                          **_ids(body, prompt if first else None,
                                                 delta.token_ids))],
                usage=self._usage(request, choices) if body.continuous_usage else None))

    # -- pieces -------------------------------------------------------------------------------

    def _echo_text(self, prompt: _Prompt) -> str:
        if prompt.text is not None:
            return prompt.text
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(prompt.token_ids, skip_special_tokens=False)

    @staticmethod
    def _prompt_positions(prompt: _Prompt, prompt_logprobs: list | None) -> list:
        if prompt_logprobs is None:
            return [None] * len(prompt.token_ids)
        return list(prompt_logprobs[:len(prompt.token_ids)])

    def _logprobs(self, token_ids: list[int], positions: list, offset: int,
                  as_ids: bool | None) -> CompletionLogprobs:
        out = CompletionLogprobs()
        for token_id, position in zip(token_ids, positions):
            token = self.token_text(token_id, position, as_ids)
            out.tokens.append(token)
            out.text_offset.append(offset)
            offset += len(token)
            if position is None or token_id not in position:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(position[token_id].logprob)
            out.top_logprobs.append({self.token_text(t, position, as_ids): lp.logprob
                                     for t, lp in position.items()})
        return out

    def _usage(self, request: _Request, choices: list[_Choice]) -> UsageInfo:
        cached = sum(p.cached_tokens for p in request.prompts)
        return UsageInfo.of(sum(len(p.token_ids) for p in request.prompts),
                            sum(len(c.token_ids) for c in choices),
                            cached if self.prompt_tokens_details else None)


def _ids(body: CompletionRequest, prompt: _Prompt | None, generated: list[int]) -> dict:
    """vLLM's return_token_ids fields of a choice (or chunk): the prompt's ids (None: not in
    this chunk) and the generated ones, never the echoed prompt's."""
    if not body.return_token_ids:
        return {}
    return {"prompt_token_ids": None if prompt is None else list(prompt.token_ids),
            "token_ids": list(generated)}
