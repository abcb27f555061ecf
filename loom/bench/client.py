"""One request to an OpenAI-compatible server, timed on the client side: streamed for
completions and chat, a single answer for embeddings (`/v1/embeddings`: its latency is
both TTFT and E2EL, no output tokens, the input's from `usage`).

A "token event" is a streamed chunk that carries generated output: for completions any chunk
with a choice, except a bare finish marker (empty text with a finish_reason); for chat a chunk
whose delta has content (the role-only opening chunk is not a token). TTFT is the time to the
first event, ITL the gaps between events. The number of output tokens comes from the
server's `usage` (requested with `stream_options.include_usage`); a server that sends none
gets its events counted instead, and the outcome says so.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"
EMBEDDINGS_ENDPOINT = "/v1/embeddings"
ENDPOINTS = (COMPLETIONS_ENDPOINT, CHAT_ENDPOINT, EMBEDDINGS_ENDPOINT)


@dataclass(frozen=True)
class RequestInput:
    url: str
    model: str
    prompt: str
    prompt_len: int
    output_len: int
    chat: bool
    ignore_eos: bool
    api_key: str | None = None
    embed: bool = False
    """An embeddings request: the prompt is the input, nothing is generated."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """Sampling fields sent as given (--temperature, --top-p, ...); greedy without."""

    def payload(self) -> dict[str, Any]:
        if self.embed:
            return {"model": self.model, "input": self.prompt}
        body: dict[str, Any] = {"model": self.model, "stream": True, "temperature": 0.0,
                                "stream_options": {"include_usage": True}, **self.sampling}
        if self.chat:
            body["messages"] = [{"role": "user", "content": self.prompt}]
            body["max_completion_tokens"] = self.output_len
        else:
            body["prompt"] = self.prompt
            body["max_tokens"] = self.output_len
        if self.ignore_eos:
            body["ignore_eos"] = True
            body["min_tokens"] = self.output_len
        return body

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass
class RequestOutcome:
    prompt_len: int
    """The dataset's count for the prompt."""
    start: float = 0.0
    """Seconds after the benchmark started that the request was sent."""
    success: bool = False
    error: str = ""
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    event_times: list[float] = field(default_factory=list)
    """Seconds after the request was sent at which each token event arrived."""
    output_tokens: int = 0
    usage_prompt_tokens: int | None = None
    tokens_from_usage: bool = False
    text: str = ""

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first; None for a single-token output."""
        if self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    @property
    def input_tokens(self) -> int:
        return self.usage_prompt_tokens if self.usage_prompt_tokens is not None else self.prompt_len


def _event_text(choice: dict[str, Any], chat: bool) -> tuple[bool, str]:
    if chat:
        content = (choice.get("delta") or {}).get("content") or ""
        return bool(content), content
    text = choice.get("text") or ""
    return bool(text) or choice.get("finish_reason") is None, text


class _Stream:
    """Folds the SSE events of one response into a RequestOutcome."""

    def __init__(self, outcome: RequestOutcome, chat: bool, sent: float) -> None:
        self.outcome, self.chat, self.sent = outcome, chat, sent
        self.last = sent
        self.done = False
        self.texts: list[str] = []

    def feed(self, line: bytes, now: float) -> None:
        data = line.decode("utf-8").strip()
        if not data.startswith("data:"):
            return  # blank separators, comments, other SSE fields
        data = data[len("data:"):].strip()
        if data == "[DONE]":
            self.done = True
            return
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"server error in stream: {chunk['error']}")
        self._usage(chunk.get("usage"))
        for choice in chunk.get("choices") or []:
            is_token, text = _event_text(choice, self.chat)
            if is_token:
                self._event(now)
            self.texts.append(text)

    def _event(self, now: float) -> None:
        o = self.outcome
        if not o.event_times:
            o.ttft = now - self.sent
        else:
            o.itl.append(now - self.last)
        o.event_times.append(now - self.sent)
        self.last = now

    def _usage(self, usage: dict[str, Any] | None) -> None:
        if usage and usage.get("completion_tokens") is not None:
            self.outcome.output_tokens = int(usage["completion_tokens"])
            self.outcome.tokens_from_usage = True
            if usage.get("prompt_tokens") is not None:
                self.outcome.usage_prompt_tokens = int(usage["prompt_tokens"])

    def finish(self, now: float) -> None:
        o = self.outcome
        o.latency = now - self.sent
        o.text = "".join(self.texts)
        if not o.tokens_from_usage:
            o.output_tokens = len(o.event_times)
        if not self.done:
            o.error = "stream ended without data: [DONE]"
        elif not o.event_times:
            o.error = "no tokens received"
        else:
            o.success = True


def _embedded(outcome: RequestOutcome, body: Any, latency: float) -> None:
    """An embeddings answer folded into the outcome: one embedding and the usage."""
    outcome.ttft = outcome.latency = latency
    data = body.get("data") if isinstance(body, dict) else None
    if not (isinstance(data, list) and len(data) == 1 and isinstance(data[0], dict)
            and data[0].get("embedding")):
        outcome.error = f"no embedding in the answer: {str(body)[:200]}"
        return
    usage = body.get("usage") or {}
    if usage.get("prompt_tokens") is not None:
        outcome.usage_prompt_tokens = int(usage["prompt_tokens"])
        outcome.tokens_from_usage = True
    outcome.success = True


async def send_request(session: aiohttp.ClientSession, req: RequestInput,
                       bench_start: float) -> RequestOutcome:
    """Stream one request (or, for embeddings, read its one answer); failures are recorded
    in the outcome, never raised."""
    outcome = RequestOutcome(prompt_len=req.prompt_len)
    sent = time.perf_counter()
    outcome.start = sent - bench_start
    stream = _Stream(outcome, req.chat, sent)
    try:
        async with session.post(req.url, json=req.payload(), headers=req.headers()) as resp:
            if resp.status != 200:
                outcome.error = f"HTTP {resp.status}: {(await resp.text())[:500]}"
                return outcome
            if req.embed:
                body = await resp.json(content_type=None)
                _embedded(outcome, body, time.perf_counter() - sent)
                return outcome
            async for line in resp.content:
                stream.feed(line, time.perf_counter())
        stream.finish(time.perf_counter())
    except (aiohttp.ClientError, RuntimeError, ValueError, TimeoutError) as e:
        outcome.error = f"{type(e).__name__}: {e}"
    return outcome
