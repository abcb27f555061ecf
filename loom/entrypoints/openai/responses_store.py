"""Stored responses (vLLM's VLLM_ENABLE_RESPONSES_API_STORE, here
LOOM_ENABLE_RESPONSES_API_STORE): with it, a response created with `store` (OpenAI's
default) is kept in the API server's memory, so that GET /v1/responses/{id} returns it and
`previous_response_id` continues its conversation. Without it, as vLLM, `store` is quietly
off: nothing is kept, and any response id is unknown (404).

vLLM's store never forgets; this one is bounded: the least recently used responses go once
there are more than `max_responses`, or once what they hold (their text, by its JSON size)
passes `max_bytes`. Each API server process has its own store.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from loom import envs
from loom.entrypoints.openai.protocol_chat import ChatMessage
from loom.entrypoints.openai.protocol_responses_output import ResponseObject

logger = logging.getLogger(__name__)

ENV = "LOOM_ENABLE_RESPONSES_API_STORE"


def store_from_env() -> ResponseStore | None:
    """The API server's store: None unless LOOM_ENABLE_RESPONSES_API_STORE is set."""
    if not envs.enable_responses_api_store():
        return None
    store = ResponseStore()
    logger.info("/v1/responses keeps stored responses in memory (%s): at most %d, %d MiB, "
                "least recently used first out", ENV, store.max_responses,
                store.max_bytes >> 20)
    return store


@dataclass(frozen=True)
class StoredResponse:
    response: ResponseObject
    conversation: list[ChatMessage]
    """Every turn up to and including this response's output, without its instructions
    (which, as OpenAI's, do not carry over to a continuation)."""
    size: int
    """Its approximate footprint in bytes: the JSON of the response and the conversation."""

    @classmethod
    def of(cls, response: ResponseObject, conversation: list[ChatMessage]) -> StoredResponse:
        size = len(response.model_dump_json()) + sum(len(m.model_dump_json())
                                                     for m in conversation)
        return cls(response, conversation, size)


class ResponseStore:
    def __init__(self, max_responses: int = 10_000, max_bytes: int = 512 * 1024 * 1024) -> None:
        self.max_responses = max_responses
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def put(self, entry: StoredResponse) -> None:
        old = self._entries.pop(entry.response.id, None)
        if old is not None:
            self._bytes -= old.size
        self._entries[entry.response.id] = entry
        self._bytes += entry.size
        while self._entries and (len(self._entries) > self.max_responses
                                 or self._bytes > self.max_bytes):
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.size
