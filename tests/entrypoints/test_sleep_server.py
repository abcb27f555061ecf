"""`loom serve --enable-sleep-mode` with LOOM_SERVER_DEV_MODE=1: vLLM's /sleep, /wake_up,
/is_sleeping and /collective_rpc, driven with the official openai client beside them.
A request that arrives asleep waits for the wake-up, and its answer is the offline LLM's."""

from __future__ import annotations

import concurrent.futures
import time

import pytest

from loom import SamplingParams
from tests.entrypoints.conftest import API_KEY, start_server

PROMPT = "Sleep test: the weather today"
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def dev_server(tiny_chat_model, tmp_path_factory):
    s = start_server(tiny_chat_model, "mp", tmp_path_factory.mktemp("sleep-logs"),
                     extra_env={"LOOM_SERVER_DEV_MODE": "1"},
                     extra_args=("--enable-sleep-mode",))
    yield s
    assert s.stop() == 0, s.log_tail()


@pytest.fixture(scope="module")
def expected(llm) -> str:
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True), use_tqdm=False)
    return out[0].outputs[0].text


def _complete(server) -> str:
    client = server.client()
    model = client.models.list().data[0].id
    answer = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS,
                                       temperature=0, extra_body={"ignore_eos": True})
    return answer.choices[0].text


def _post(server, path: str, **kwargs):
    with server.http(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as http:
        return http.post(path, **kwargs)


def _sleeping(server) -> bool:
    with server.http(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        return http.get("/is_sleeping").json()["is_sleeping"]


def test_a_request_sent_asleep_waits_for_the_wake_up(dev_server, expected):
    assert _complete(dev_server) == expected and not _sleeping(dev_server)
    assert _post(dev_server, "/sleep", params={"level": 1}).status_code == 200
    assert _sleeping(dev_server)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_complete, dev_server)
        time.sleep(1.0)
        assert not waiting.done()  # accepted, held until the wake-up
        assert _post(dev_server, "/wake_up").status_code == 200
        assert waiting.result(timeout=60) == expected
    assert not _sleeping(dev_server)


def test_level_2_then_reload_weights_by_collective_rpc(dev_server, expected):
    assert _post(dev_server, "/sleep", params={"level": 2}).status_code == 200
    assert _post(dev_server, "/wake_up", params={"tags": "weights"}).status_code == 200
    assert _sleeping(dev_server)  # the KV cache still sleeps
    reply = _post(dev_server, "/collective_rpc", json={"method": "reload_weights"})
    assert reply.status_code == 200 and reply.json() == {"results": [None]}
    info = _post(dev_server, "/collective_rpc", json={"method": "model_info"}).json()
    assert info["results"][0]["vocab_size"] > 0
    assert _post(dev_server, "/wake_up", params={"tags": "kv_cache"}).status_code == 200
    assert not _sleeping(dev_server)
    assert _complete(dev_server) == expected


@pytest.mark.parametrize("path, kwargs, message", [
    ("/sleep", {"params": {"level": 5}}, "sleep.level: must be 0, 1 or 2, got 5"),
    ("/sleep", {"params": {"mode": "soon"}}, "sleep.mode: must be one of abort, wait, keep"),
    ("/sleep", {"params": {"tags": "lora"}}, "sleep.tags: 'lora' is not a memory tag"),
    ("/wake_up", {"params": {"tags": "kv"}}, "wake_up.tags: 'kv' is not a memory tag"),
    ("/collective_rpc", {"json": {"method": "launch"}}, "'launch' is not a worker method"),
    ("/collective_rpc", {"json": {"args": []}}, "method: a worker method's name is required"),
    ("/collective_rpc", {"json": {"method": "model_info", "args": {}}}, "args: must be"),
    ("/collective_rpc", {"json": {"method": "model_info", "timeout": 3}}, "timeout: loom"),
])
def test_bad_dev_requests_are_400s_with_an_openai_error(dev_server, expected, path, kwargs,
                                                        message):
    reply = _post(dev_server, path, **kwargs)
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"]
    assert not _sleeping(dev_server)
    assert _complete(dev_server) == expected  # the engine lives on, unchanged
