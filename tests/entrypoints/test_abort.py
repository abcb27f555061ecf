"""The seed reviewer's case: requests that would generate 2000 tokens, their connections
dropped (streaming or not); within seconds the engine runs nothing, every KV block is free,
and each API process is back to the asyncio tasks it had before."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx

from tests.entrypoints.conftest import API_KEY

LONG = {"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "temperature": 0}
DEADLINE_S = 5.0


def _by_pid(server, want: int, attempts: int = 60) -> dict[int, dict]:
    """Introspect until `want` distinct API processes have answered."""
    seen: dict[int, dict] = {}
    for _ in range(attempts):
        info = server.introspect()
        seen[info["pid"]] = info
        if len(seen) >= want:
            break
    return seen


async def _drop_streams(url: str, count: int) -> int:
    """Open `count` streams, read a few events of each, then drop them all; returns how many
    requests the engine was running just before."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(timeout=30, headers=headers) as client:
        async with contextlib.AsyncExitStack() as streams:
            readers = []  # kept alive: a collected line iterator would close its connection
            for i in range(count):
                body = {**LONG, "stream": True, "prompt": f"{LONG['prompt']} {i}",
                        "n": 1 + i % 2}
                r = await streams.enter_async_context(
                    client.stream("POST", f"{url}/v1/completions", json=body))
                assert r.status_code == 200
                lines = r.aiter_lines()
                readers.append(lines)
                for _ in range(3):
                    assert (await anext(lines)).startswith("data:")
                    await anext(lines)  # the blank line after each event
            info = (await client.get(f"{url}/_loom/introspect")).json()
        # Leaving the stack closed every connection mid-stream.
    return info["engine_unfinished"]


async def _drop_waiting(url: str, count: int) -> None:
    headers = {"Authorization": f"Bearer {API_KEY}"}

    async def one(i: int) -> None:
        # A fresh client per request: its timeout closes the connection for good.
        async with httpx.AsyncClient(timeout=1.0, headers=headers) as client:
            try:
                # Two prompts and n=2: four engine requests behind one connection.
                await client.post(f"{url}/v1/completions",
                                  json={**LONG, "prompt": [f"tale {i}", f"saga {i}"], "n": 2})
            except httpx.TimeoutException:
                return
            raise AssertionError("a 2000-token request answered within 1 s")
    await asyncio.gather(*(one(i) for i in range(count)))


def _wait_idle(server, num_procs: int) -> dict[int, dict]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        infos = _by_pid(server, num_procs)
        idle = all(i["engine_unfinished"] == 0 and i["kv"]["num_free_blocks"] == i["kv"]["num_blocks"]
                   and i["streams"] == 0 and i["tracked_engine_requests"] == 0
                   for i in infos.values())
        if idle or time.monotonic() > deadline:
            return infos
        time.sleep(0.1)  # polling another process's state


def test_dropped_connections_abort_everything(server):
    num_procs = 2 if server.mode == "mp2" else 1
    before = _by_pid(server, num_procs)
    assert len(before) == num_procs
    start = time.monotonic()
    assert asyncio.run(_drop_streams(server.url, 4)) == 6  # two of them with n=2
    asyncio.run(_drop_waiting(server.url, 4))
    after = _wait_idle(server, num_procs)
    elapsed = time.monotonic() - start
    for pid, info in after.items():
        assert info["engine_unfinished"] == 0, info
        assert info["kv"]["num_free_blocks"] == info["kv"]["num_blocks"], info
        assert info["streams"] == 0 and info["tracked_engine_requests"] == 0, info
        assert info["tasks"] == before[pid]["tasks"], (before[pid], info)
    assert elapsed < 30, elapsed
    assert _running_gauge_settles_to_zero(server.url)


def _running_gauge_settles_to_zero(url: str) -> bool:
    """The gauge follows the engine's stats messages, which reach the API process a moment
    after the engine went idle: poll it, with a bound."""
    deadline = time.monotonic() + 10
    while True:
        metrics = httpx.get(f"{url}/metrics").text
        running = [line for line in metrics.splitlines()
                   if line.startswith("loom:num_requests_running{")]
        assert running, "loom:num_requests_running missing from /metrics"
        if float(running[0].rsplit(" ", 1)[1]) == 0.0:
            return True
        if time.monotonic() > deadline:
            raise AssertionError(running)
        time.sleep(0.1)  # polling another process's state
