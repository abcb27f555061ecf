"""Kill the engine core mid-stream: the stream ends with an error event, a waiting request
gets a 500, /health answers 503, and the server exits non-zero within seconds."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import openai
import pytest

from tests.entrypoints.conftest import MODES, start_server

LONG = dict(prompt="Once upon a time", max_tokens=3000, temperature=0,
            extra_body={"ignore_eos": True})
EXIT_DEADLINE_S = 30.0


def _kill_engine(server, info: dict) -> None:
    if info["engine_pid"] == info["pid"]:  # in-process engine: make its loop fail
        r = httpx.post(f"{server.url}/_loom/crash_engine", timeout=10)
        assert r.status_code == 200, r.text
    else:
        os.kill(info["engine_pid"], signal.SIGKILL)


def _health_until_503(server) -> int:
    deadline = time.monotonic() + 10
    status = None
    while time.monotonic() < deadline:
        try:
            status = httpx.get(f"{server.url}/health", timeout=2).status_code
        except httpx.HTTPError:
            return -1  # already gone
        if status == 503:
            return status
        time.sleep(0.05)  # polling another process's state
    return status


@pytest.mark.parametrize("mode", list(MODES))
def test_engine_killed_mid_stream(mode, tiny_chat_model, tmp_path):
    server = start_server(tiny_chat_model, mode, tmp_path,
                          extra_env={"LOOM_ENGINE_DEAD_LINGER_S": "3"})
    try:
        client = server.client()
        model = client.models.list().data[0].id
        info = server.introspect()
        waiting_error: list[BaseException] = []

        def whole_request() -> None:
            try:
                client.completions.create(model=model, **LONG)
            except BaseException as e:  # noqa: BLE001 - recorded for the main thread
                waiting_error.append(e)
        stream = client.completions.create(model=model, stream=True, **LONG)
        received = [next(stream) for _ in range(3)]
        assert all(c.choices for c in received)
        waiter = threading.Thread(target=whole_request)
        waiter.start()
        deadline = time.monotonic() + 10
        while server.introspect()["engine_unfinished"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        _kill_engine(server, info)
        with pytest.raises(openai.APIError) as stream_error:
            for _ in stream:
                pass
        assert "engine" in str(stream_error.value).lower()
        waiter.join(30)
        assert waiting_error and isinstance(waiting_error[0], openai.InternalServerError), waiting_error
        assert _health_until_503(server) == 503
        code = server.proc.wait(EXIT_DEADLINE_S)
        assert code != 0, server.log_tail()
    finally:
        server.stop()


def _spawned_children(pid: int) -> list[int]:
    """Child processes started by multiprocessing spawn (not its resource tracker)."""
    tasks = f"/proc/{pid}/task"
    children = [int(c) for t in os.listdir(tasks)
                for c in open(f"{tasks}/{t}/children").read().split()]
    return [c for c in children if b"spawn_main" in open(f"/proc/{c}/cmdline", "rb").read()]


def test_tensor_parallel_worker_killed_mid_stream(tiny_chat_model, tmp_path):
    server = start_server(tiny_chat_model, "mp", tmp_path, extra_args=("-tp", "2"),
                          extra_env={"LOOM_ENGINE_DEAD_LINGER_S": "3"})
    try:
        client = server.client()
        engine_pid = server.introspect()["engine_pid"]
        workers = _spawned_children(engine_pid)
        assert len(workers) == 2, workers
        stream = client.completions.create(model=client.models.list().data[0].id, stream=True,
                                           **LONG)
        next(stream)
        os.kill(workers[-1], signal.SIGKILL)
        with pytest.raises(openai.APIError, match="worker"):
            for _ in stream:
                pass
        assert _health_until_503(server) == 503
        assert server.proc.wait(EXIT_DEADLINE_S) != 0, server.log_tail()
    finally:
        server.stop()
