"""Pure ASGI middleware (no BaseHTTPMiddleware, so `receive` reaches the handlers untouched
and a client's disconnect is still seen): the API key, the request-body size cap, the
X-Request-Id response header and SageMaker's /invocations."""

from __future__ import annotations

import hmac
import json
import uuid

from starlette._utils import get_route_path
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loom.entrypoints.openai.errors import error_body


async def _send_error(send: Send, status: int, message: str, extra_headers=()) -> None:
    body = error_body(status, message)
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), *extra_headers]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class APIKeyMiddleware:
    """Every /v1 route needs `Authorization: Bearer <key>`; compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The path as the router sees it (its own function, so the two never disagree):
        # under --root-path, /prefix/v1/... reaches the /v1 routes too.
        if scope["type"] != "http" or not get_route_path(scope).startswith("/v1"):
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, self.expected):
            await _send_error(send, 401, "missing or invalid API key",
                              [(b"www-authenticate", b"Bearer")])
            return
        await self.app(scope, receive, send)


class BodySizeLimitMiddleware:
    """Refuse request bodies over `max_bytes`: by Content-Length up front (413), or while a
    body without one is read."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await _send_error(send, 413, f"request body over the limit of {self.max_bytes} bytes")
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, f"request body over the limit of {self.max_bytes} bytes")
            return message
        return counted


class RequestIdHeaderMiddleware:
    """--enable-request-id-headers (vLLM's): every response carries X-Request-Id, the
    request's own where it sent one, else a fresh one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = dict(scope["headers"]).get(b"x-request-id") or uuid.uuid4().hex.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.lower() != b"x-request-id"]
                message = {**message, "headers": [*headers, (b"x-request-id", request_id)]}
            await send(message)
        await self.app(scope, receive, send_with_id)


class InvocationsMiddleware:
    """SageMaker's POST /invocations (vLLM's): the body goes to the route its fields name,
    which checks and answers it as if it had been sent there (the API key included, since
    this runs outside that check). `route(body)` returns the path, or raises ValueError."""

    def __init__(self, app: ASGIApp, route) -> None:
        self.app = app
        self.route = route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or get_route_path(scope) != "/invocations"):
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            path = self.route(json.loads(body))
        except ValueError as e:
            await _send_error(send, 400, f"invocations: {e}")
            return
        prefix = scope["path"][:-len("/invocations")]
        scope = {**scope, "path": prefix + path, "raw_path": (prefix + path).encode()}
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # the disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, replay, send)
