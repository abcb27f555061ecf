"""vLLM's --stream-interval N: a streamed choice goes out every N tokens instead of every
engine step. As vLLM sends them: a choice's first output at once (time to first token is
not held back), then whenever N tokens have gathered since its last one, and what is left
when it finishes. Held deltas are joined, so text, token ids and logprobs stay together."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import aclosing

from loom.outputs import CompletionOutput, RequestOutput


class Interval:
    """One streamed choice's deltas, held until they may go out."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.held: CompletionOutput | None = None
        self.sent = 0
        """Tokens sent so far: none yet sends at once."""

    def take(self, delta: CompletionOutput) -> CompletionOutput | None:
        """The delta to send now (all held so far joined with this one), or None: hold it."""
        if self.tokens == 1:
            return delta
        joined = delta if self.held is None else _join(self.held, delta)
        if not (delta.finished or self.sent == 0 or len(joined.token_ids) >= self.tokens):
            self.held = joined
            return None
        self.held = None
        self.sent += len(joined.token_ids)
        return joined


def every(outputs: AsyncIterator[RequestOutput], tokens: int) -> AsyncIterator[RequestOutput]:
    """A request's streamed outputs with each choice's deltas held as `Interval` says; an
    output none of whose choices may go out is not sent."""
    return outputs if tokens == 1 else _every(outputs, tokens)


async def _every(outputs: AsyncIterator[RequestOutput], tokens: int
                 ) -> AsyncIterator[RequestOutput]:
    choices: dict[int, Interval] = {}
    async with aclosing(outputs):  # closing this closes (aborts) the request at once
        async for output in outputs:
            ready = [d for d in (choices.setdefault(o.index, Interval(tokens)).take(o)
                                 for o in output.outputs) if d is not None]
            if ready:
                yield dataclasses.replace(output, outputs=ready)


def _join(first: CompletionOutput, then: CompletionOutput) -> CompletionOutput:
    logprobs = (None if first.logprobs is None and then.logprobs is None
                else (first.logprobs or []) + (then.logprobs or []))
    return dataclasses.replace(then, text=first.text + then.text,
                               token_ids=first.token_ids + then.token_ids, logprobs=logprobs)
