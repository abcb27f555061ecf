"""POST /v1/chat/completions: the chat template, n choices, logprobs/top_logprobs, tool
calls, streamed or whole."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, Response

from loom.entrypoints.openai.errors import APIError
from loom.entrypoints.openai.protocol import UsageInfo
from loom.entrypoints.openai.protocol_chat import (ChatChoice, ChatCompletionChunk,
                                                   ChatCompletionRequest, ChatCompletionResponse,
                                                   ChatMessage, ChatMessageOut, ChatStreamChoice,
                                                   ChoiceLogprobs, DeltaMessage, DeltaToolCall,
                                                   TokenLogprob, ToolCallOut, TopLogprob,
                                                   render_chat)
from loom.entrypoints.openai.serving_base import (SSE_DONE, OpenAIServing, merge, off_loop, sse,
                                                  sse_error, stream_from_first)
from loom.entrypoints.openai.output_split import OutputSplit, SplitStream
from loom.entrypoints.openai.reasoning import REASONING_PARSERS
from loom.entrypoints.openai.stream_interval import every
from loom.entrypoints.openai.tool_calls import ToolCall, ToolCalls
from loom.frontend.processor import check_num_logprobs
from loom.outputs import CompletionOutput, PositionLogprobs


@dataclass
class _Chat:
    id: str
    model: str
    created: int
    body: ChatCompletionRequest
    prompt_ids: list[int]
    split: OutputSplit
    """Thinking (--reasoning-parser), content and the request's tool calls."""
    cached_tokens: int | None = None
    """Prompt tokens from the prefix cache, counted with --enable-prompt-tokens-details."""

    def seen(self, output) -> None:
        if self.cached_tokens is not None:
            self.cached_tokens = max(self.cached_tokens, output.num_cached_tokens)

    @property
    def prompt_ids_if_asked(self) -> list[int] | None:
        """vLLM's return_token_ids: the prompt's ids as the engine ran them, else None."""
        return self.prompt_ids if self.body.return_token_ids else None

    def split_whole(self, text: str, finish_reason: str | None
                    ) -> tuple[str | None, str | None, list[ToolCall], str | None]:
        """A finished choice's (reasoning, content, tool calls, finish reason)."""
        thinking, content, calls, finish_reason = self.split.whole(text, finish_reason)
        return (thinking if self.body.include_reasoning else None), content, calls, finish_reason


class OpenAIServingChat(OpenAIServing):
    def __init__(self, *args, tool_call_parser: str | None = None,
                 reasoning_parser: str | None = None, trust_request_chat_template: bool = False,
                 response_role: str = "assistant", content_format: str = "auto",
                 default_template_kwargs: dict[str, Any] | None = None,
                 exclude_tools_when_none: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.exclude_tools_when_none = exclude_tools_when_none
        """--exclude-tools-when-tool-choice-none."""
        self.default_template_kwargs = dict(default_template_kwargs or {})
        """--default-chat-template-kwargs: template variables under each request's own."""
        self.trust_request_chat_template = trust_request_chat_template
        self.response_role = response_role
        """--response-role: the reply's role when the prompt ends with the generation prompt."""
        self.content_format = content_format
        """--chat-template-content-format: "auto", "string" or "openai"."""
        self.tool_call_parser = tool_call_parser
        """--tool-call-parser, set with --enable-auto-tool-choice: what tool_choice "auto"
        reads calls with; None refuses "auto"."""
        self.reasoning_parser = REASONING_PARSERS[reasoning_parser] if reasoning_parser else None

    def check_request_template(self, chat_template: str | None) -> None:
        if chat_template is not None and not self.trust_request_chat_template:
            # As vLLM without --trust-request-chat-template: a template is code.
            raise APIError(400, "a request may not bring its own chat template unless the "
                                "server runs with --trust-request-chat-template; or start it "
                                "with --chat-template", "chat_template")

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
               continue_final_message: bool = False,
               template_variables: dict[str, Any] | None = None,
               chat_template: str | None = None) -> list[int]:
        """The prompt's token ids, exactly as `LLM.chat` builds them; template_variables:
        more variables for the chat template (tools, chat_template_kwargs), each over the
        server's default of that name."""
        if self.tokenizer is None:
            raise APIError(400, "chat needs a tokenizer; this server has none", "messages")
        variables = {**self.default_template_kwargs, **(template_variables or {})}
        try:
            text = render_chat(self.tokenizer, messages, add_generation_prompt,
                               continue_final_message, chat_template, variables,
                               self.content_format)
        except ValueError as e:  # no template, the template refused the messages, or the
            raise APIError(400, str(e), "messages") from e  # final message is not in it
        # The template writes the special tokens (BOS) itself.
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _role(self, body: ChatCompletionRequest) -> str:
        """vLLM's: --response-role after a generation prompt; else the model continues the
        last message, whose role the reply keeps."""
        return self.response_role if body.add_generation_prompt else body.messages[-1].role

    def _echoed(self, body: ChatCompletionRequest) -> str:
        """vLLM's echo: the last message's text (parts joined by newlines) where its role is
        the reply's, put before the reply's content; else nothing."""
        last = body.messages[-1]
        if not body.echo or last.role != self._role(body):
            return ""
        return "\n".join(last.texts())

    async def create(self, body: ChatCompletionRequest,
                     trace_headers: Mapping[str, str] | None = None,
                     header_id: str | None = None) -> Response:
        """header_id: the request's X-Request-Id header, the id's base before request_id."""
        model, lora = self.resolve_model(body.model)
        # Before the Processor's own check, which would name SamplingParams' "logprobs".
        check_num_logprobs("top_logprobs", body.top_logprobs, self.engine.processor.max_logprobs)
        tools = ToolCalls.for_request(body.tools, body.tool_choice, body.parallel_tool_calls,
                                      self.tool_call_parser)
        self.check_request_template(body.chat_template)
        variables = body.template_variables
        if self.exclude_tools_when_none and body.tool_choice == "none":
            variables = {**variables, "tools": None}
        prompt_ids = await off_loop(self.render, body.messages, body.add_generation_prompt,
                                    body.continue_final_message, variables, body.chat_template)
        # a rendered chat is tokenized without added special tokens: cut plainly
        prompt_ids = self.engine.processor.truncate(prompt_ids, body.truncate_prompt_tokens,
                                                    False)
        params = body.to_sampling_params(self.max_tokens_for(len(prompt_ids),
                                                             body.requested_max_tokens),
                                         self.sampling_defaults)
        # A constraint (a schema, a forced tool call) applies from the first token, so the
        # output holds no thinking the template opened: deepseek_r1 would take it all for
        # thinking. qwen3 only splits an output that opens <think> itself.
        reasoning = self.reasoning_parser
        if params.guided_decoding is not None and reasoning and reasoning.opened_by_template:
            reasoning = None
        chat = _Chat(self.new_id("chatcmpl", header_id or body.request_id), model,
                     int(time.time()), body, prompt_ids, OutputSplit(tools, reasoning),
                     0 if self.prompt_tokens_details else None)
        if tools.keeps_special_tokens:
            params.skip_special_tokens = False  # the parser reads the call markers
        if body.use_beam_search:
            beams = await self.beam_search(prompt_ids, body.beam_search_params(params.max_tokens),
                                           chat.id, lora, body.cache_salt, body.priority)
            ids = [beam.tokens[len(prompt_ids):] for beam in beams]
            choices = [ChatChoice(index=k, message=ChatMessageOut(
                role=self._role(body), content=self._echoed(body) + beam.text),
                                  finish_reason=beam.finish_reason,
                                  token_ids=ids[k] if body.return_token_ids else None)
                       for k, beam in enumerate(beams)]
            return JSONResponse(ChatCompletionResponse(
                id=chat.id, created=chat.created, model=chat.model, choices=choices,
                usage=UsageInfo.of(len(prompt_ids), sum(map(len, ids))),
                prompt_token_ids=chat.prompt_ids_if_asked).model_dump(mode="json"))
        interval = self.stream_interval if body.stream else 1
        outputs = merge([every(self.engine.generate(prompt_ids, params, chat.id, trace_headers,
                                                    body.cache_salt, lora_request=lora,
                                                    priority=body.priority), interval)])
        if body.stream:
            return await self._stream(chat, outputs)
        return await self._whole(chat, outputs)

    async def _whole(self, chat: _Chat, outputs: AsyncIterator) -> Response:
        n = chat.body.n
        texts, tokens = [""] * n, [[] for _ in range(n)]
        logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
        finish: list[CompletionOutput | None] = [None] * n
        prompt_logprobs = None
        async with aclosing(outputs):
            async for _, output in outputs:
                chat.seen(output)
                prompt_logprobs = output.prompt_logprobs or prompt_logprobs
                for delta in output.outputs:
                    texts[delta.index] += delta.text
                    tokens[delta.index] += delta.token_ids
                    logprobs[delta.index] += self.token_logprobs(delta, chat.body)
                    finish[delta.index] = delta
        choices = []
        for i in range(n):
            thinking, content, calls, reason = chat.split_whole(
                texts[i], finish[i].finish_reason if finish[i] else None)
            echoed = self._echoed(chat.body)
            message = ChatMessageOut(role=self._role(chat.body),
                                     content=echoed + (content or "") if echoed else content,
                                     reasoning=thinking,
                                     tool_calls=[ToolCallOut.of(c) for c in calls] or None)
            choices.append(ChatChoice(
                index=i, message=message, finish_reason=reason,
                logprobs=ChoiceLogprobs(content=logprobs[i]) if chat.body.logprobs else None,
                stop_reason=finish[i].stop_reason if finish[i] else None,
                token_ids=tokens[i] if chat.body.return_token_ids else None))
        response = ChatCompletionResponse(
            id=chat.id, created=chat.created, model=chat.model, choices=choices,
            usage=_usage(chat, sum(map(len, tokens))),
            prompt_logprobs=self.prompt_logprobs(prompt_logprobs)
            if chat.body.prompt_logprobs is not None else None,
            prompt_token_ids=chat.prompt_ids_if_asked)
        return JSONResponse(response.model_dump(mode="json"))

    async def _stream(self, chat: _Chat, outputs: AsyncIterator) -> Response:
        return await stream_from_first(outputs, lambda first: self._events(chat, first, outputs))

    async def _events(self, chat: _Chat, first, outputs: AsyncIterator) -> AsyncIterator[str]:
        completion_tokens = 0
        streams = [chat.split.stream() for _ in range(chat.body.n)]
        try:
            echoed = self._echoed(chat.body)
            for i in range(chat.body.n):  # the role first, as OpenAI streams it
                role = ChatStreamChoice(index=i, delta=DeltaMessage(role=self._role(chat.body),
                                                                    content=""))
                yield self._chunk(chat, role, 0, chat.prompt_ids_if_asked)
                if echoed:  # then what echo puts before the reply
                    yield self._chunk(chat, ChatStreamChoice(
                        index=i, delta=DeltaMessage(content=echoed)), 0)
            async with aclosing(outputs):
                item = first
                while item is not None:
                    chat.seen(item[1])
                    for delta in item[1].outputs:
                        completion_tokens += len(delta.token_ids)
                        if delta.text or delta.finish_reason is not None or delta.token_ids:
                            choice = self._stream_choice(chat, delta, streams[delta.index])
                            yield self._chunk(chat, choice, completion_tokens)
                    item = await anext(outputs, None)
            if chat.body.include_usage or self.force_include_usage:
                yield sse(ChatCompletionChunk(id=chat.id, created=chat.created, model=chat.model,
                                              choices=[], usage=_usage(chat, completion_tokens)))
        except Exception as e:  # noqa: BLE001 - the status is sent; say what went wrong in-band
            yield sse_error(e)
        yield SSE_DONE

    def _stream_choice(self, chat: _Chat, delta: CompletionOutput,
                       stream: SplitStream) -> ChatStreamChoice:
        logprobs = (ChoiceLogprobs(content=self.token_logprobs(delta, chat.body))
                    if chat.body.logprobs else None)
        thinking, content, calls, reason = stream.feed(delta.text, delta.finish_reason)
        thinking = thinking if chat.body.include_reasoning else ""
        message = DeltaMessage(reasoning=thinking or None,
                               content=None if thinking and not content else content,
                               tool_calls=[DeltaToolCall.of(c) for c in calls] or None)
        return ChatStreamChoice(index=delta.index, delta=message, logprobs=logprobs,
                                finish_reason=reason, stop_reason=delta.stop_reason,
                                token_ids=list(delta.token_ids) if chat.body.return_token_ids
                                else None)

    @staticmethod
    def _chunk(chat: _Chat, choice: ChatStreamChoice, completion_tokens: int,
               prompt_token_ids: list[int] | None = None) -> str:
        usage = _usage(chat, completion_tokens) if chat.body.continuous_usage else None
        return sse(ChatCompletionChunk(id=chat.id, created=chat.created, model=chat.model,
                                       choices=[choice], usage=usage,
                                       prompt_token_ids=prompt_token_ids))

    def token_logprobs(self, delta: CompletionOutput, body: ChatCompletionRequest
                       ) -> list[TokenLogprob]:
        """A delta's tokens' logprobs as chat reports them (the Responses API's too)."""
        if not delta.logprobs:
            return []
        return [self._token_logprob(t, p, body.top_logprobs or 0, body.return_tokens_as_token_ids)
                for t, p in zip(delta.token_ids, delta.logprobs)]

    def _token_logprob(self, token_id: int, position: PositionLogprobs, top_n: int,
                       as_ids: bool | None) -> TokenLogprob:
        ranked = sorted(position, key=lambda t: -position[t].logprob)[:top_n]
        chosen = self._top(token_id, position, as_ids)
        return TokenLogprob(token=chosen.token, logprob=chosen.logprob, bytes=chosen.bytes,
                            top_logprobs=[self._top(t, position, as_ids) for t in ranked])

    def _top(self, token_id: int, position: PositionLogprobs,
             as_ids: bool | None) -> TopLogprob:
        text = self.token_text(token_id, position, as_ids)
        return TopLogprob(token=text, logprob=position[token_id].logprob,
                          bytes=list(text.encode("utf-8")))


def _usage(chat: _Chat, completion_tokens: int) -> UsageInfo:
    return UsageInfo.of(len(chat.prompt_ids), completion_tokens, chat.cached_tokens)

