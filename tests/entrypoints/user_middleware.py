"""An operator's middleware for `--middleware` (vLLM's): one async function, one ASGI class."""


async def stamp(request, call_next):
    response = await call_next(request)
    response.headers["x-operator-function"] = request.url.path
    return response


class Stamp:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send):
        async def stamped(message):
            if message["type"] == "http.response.start":
                message.setdefault("headers", []).append((b"x-operator-class", b"1"))
            await send(message)
        await self.app(scope, receive, stamped if scope["type"] == "http" else send)


NOT_MIDDLEWARE = 3
