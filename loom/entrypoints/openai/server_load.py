"""vLLM's GET /load and --enable-server-load-tracking: how many generation requests this
API server has in flight, for a load balancer to read. Each API server counts its own."""

from __future__ import annotations

from fastapi import FastAPI
from starlette._utils import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

TRACKED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/embeddings",
                           "/v1/responses", "/score", "/v1/score", "/rerank", "/v1/rerank",
                           "/v2/rerank"})
"""The routes vLLM counts (those that run the model), as loom serves them; /v1/responses/...
(retrieve, cancel) too."""


class ServerLoad:
    """The count GET /load reports: 0 without tracking, as vLLM's."""

    def __init__(self) -> None:
        self.in_flight = 0


class LoadTrackingMiddleware:
    """Counts a tracked request from its arrival until its response is sent, the end of a
    stream included (as vLLM's, which decrements once the body is out)."""

    def __init__(self, app: ASGIApp, load: ServerLoad) -> None:
        self.app = app
        self.load = load

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _tracked(get_route_path(scope)):
            await self.app(scope, receive, send)
            return
        self.load.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.load.in_flight -= 1


def _tracked(path: str) -> bool:
    return path in TRACKED_PATHS or path.startswith("/v1/responses/")


def add_server_load(app: FastAPI, tracking: bool) -> None:
    """GET /load, and with tracking the counting middleware; call it before the API key's
    middleware is added, so that a refused request is never counted (vLLM counts requests
    that reach their handler)."""
    load = ServerLoad()

    @app.get("/load")
    async def server_load() -> dict:
        return {"server_load": load.in_flight}

    if tracking:
        app.add_middleware(LoadTrackingMiddleware, load=load)
