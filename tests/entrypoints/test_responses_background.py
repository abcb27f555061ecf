"""Background responses (`background: true`) through the official openai client: queued at
once, polled to the same response a synchronous request gets, streamed at creation and
again from a sequence number, cancelled mid-run (the engine left idle)."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from tests.entrypoints.conftest import forced
from tests.entrypoints.test_responses import _model, _same

DEADLINE_S = 30.0
LONG = {"max_output_tokens": 2000, "extra_body": {"ignore_eos": True}}


def _until_ended(client, response_id: str):
    end = time.monotonic() + DEADLINE_S
    while True:
        got = client.responses.retrieve(response_id)
        if got.status not in ("queued", "in_progress") or time.monotonic() > end:
            return got
        time.sleep(0.05)


def _engine_idle(server) -> bool:
    end = time.monotonic() + DEADLINE_S
    while server.introspect()["engine_unfinished"] and time.monotonic() < end:
        time.sleep(0.05)
    return server.introspect()["engine_unfinished"] == 0


def test_background_response_polls_to_the_synchronous_one(parsing_server):
    client = parsing_server.client()
    kw = dict(model=_model(parsing_server), input="Name three colours.", temperature=0,
              max_output_tokens=30, extra_body=forced("Red, green, blue."))
    sync = client.responses.create(**kw)
    queued = client.responses.create(**kw, background=True)
    assert (queued.status, queued.background, queued.output) == ("queued", True, [])
    final = _until_ended(client, queued.id)
    assert final.status == "completed" and final.background
    assert _same(final) == {**_same(sync), "background": True}
    # ended: cancelling returns it as it is; streaming it again, its final state
    assert client.responses.cancel(queued.id).status == "completed"
    [event] = list(client.responses.retrieve(queued.id, stream=True))
    assert event.type == "response.completed" and _same(event.response) == _same(final)
    with pytest.raises(openai.BadRequestError, match="synchronous"):
        client.responses.cancel(sync.id)
    with pytest.raises(openai.BadRequestError, match="only a background response"):
        client.responses.retrieve(sync.id, stream=True)


def test_background_stream_resumes_and_cancels(parsing_server):
    """A long background run streamed at creation; a second stream of it from sequence
    number 3 sends the same events from 4 on; a cancel ends both and the engine request."""
    client = parsing_server.client()
    kw = dict(model=_model(parsing_server), input="Tell a story.", temperature=0, **LONG)
    first = client.responses.create(**kw, background=True, stream=True)
    head = [next(first) for _ in range(8)]
    assert [e.sequence_number for e in head] == list(range(8))
    assert head[0].type == "response.created" and head[0].response.background
    response_id = head[0].response.id
    assert client.responses.retrieve(response_id).status == "in_progress"
    second = client.responses.retrieve(response_id, stream=True, starting_after=3)
    again = [next(second) for _ in range(6)]
    assert [e.sequence_number for e in again] == list(range(4, 10))
    more = head + [next(first) for _ in range(2)]
    assert [e.model_dump() for e in again] == [e.model_dump() for e in more[4:10]]

    cancelled = client.responses.cancel(response_id)
    assert cancelled.status == "cancelled" and cancelled.background
    assert client.responses.retrieve(response_id).status == "cancelled"
    rest = list(first) + list(second)  # both streams end, the response unfinished
    assert not {e.type for e in rest} & {"response.completed", "response.incomplete"}
    assert _engine_idle(parsing_server)


@pytest.mark.parametrize("server", ["inproc"], indirect=True)
def test_background_needs_the_store(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="LOOM_ENABLE_RESPONSES_API_STORE") as e:
        client.responses.create(model=_model(server), input="hi", background=True)
    assert e.value.body["param"] == "background"


def test_follow_replays_then_waits():
    """BackgroundRun.follow: what was sent after `starting_after`, then each new event as it
    comes, ending when the run closes; a follower that joins after the end gets the rest."""
    from loom.entrypoints.openai.responses_background import BackgroundRun

    async def main():
        run = BackgroundRun()
        for i in range(3):
            run.add(f"e{i}")
        got = []

        async def follow(after):
            got.append([e async for e in run.follow(after)])
        task = asyncio.ensure_future(follow(0))
        await asyncio.sleep(0)
        run.add("e3")
        await asyncio.sleep(0)
        run.add("e4")
        run.close()
        await task
        await follow(None)
        await follow(10)
        return got
    assert asyncio.run(main()) == [["e1", "e2", "e3", "e4"],
                                    ["e0", "e1", "e2", "e3", "e4"], []]
