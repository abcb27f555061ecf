"""Background responses (`background: true`, as OpenAI and vLLM run them): POST
/v1/responses answers at once with the response queued while a task generates it; GET
/v1/responses/{id} returns its state so far (queued, in_progress, then completed,
incomplete, failed or cancelled) and, with `stream=true`, its events after `starting_after`,
live until it ends; POST /v1/responses/{id}/cancel stops it, aborting its engine request.
A client that disconnects does not stop it. Its state lives in the response store, so a
background response must be stored (`store`, and the server's
LOOM_ENABLE_RESPONSES_API_STORE).

A response's events are kept while it runs, for GET's stream; once it has ended, that
stream is one event with the final response.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


class BackgroundRun:
    """One background response: the task generating it and the stream events it has sent
    (SSE text; the i-th carries sequence_number i, as `ResponseEvents` numbers them)."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.task: asyncio.Task | None = None
        self.done = False
        self._wake = asyncio.Event()

    def add(self, event: str) -> None:
        self.events.append(event)
        self._notify()

    def close(self) -> None:
        self.done = True
        self._notify()

    def _notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()  # followers wait on the one they saw

    async def follow(self, starting_after: int | None = None) -> AsyncIterator[str]:
        """The events after sequence number `starting_after` (all for None): those sent so
        far, then each as it comes, until the response ends."""
        i = 0 if starting_after is None else max(starting_after + 1, 0)
        while True:
            wake = self._wake
            if i < len(self.events):
                yield self.events[i]
                i += 1
            elif self.done:
                return
            else:
                await wake.wait()
