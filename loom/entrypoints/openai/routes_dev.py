"""vLLM's development routes, with LOOM_SERVER_DEV_MODE=1 (VLLM_SERVER_DEV_MODE): sleep mode
(`loom.engine.core_sleep`), worker calls by name and the prefix cache's reset. No end user
should reach them: they pause, free and reload the engine for everyone."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response

from loom.entrypoints.openai.errors import error_response

logger = logging.getLogger(__name__)


def _json_value(value: Any) -> Any:
    """A worker's answer as JSON: containers and scalars as they are, others as text."""
    if value is None or isinstance(value, bool | int | float | str | list | dict):
        return value
    return str(value)


def add_dev_routes(app: FastAPI, engine) -> None:
    logger.warning("development routes on (LOOM_SERVER_DEV_MODE): /sleep, /wake_up, "
                   "/is_sleeping, /collective_rpc and /reset_prefix_cache; keep them from "
                   "end users")

    @app.post("/sleep")
    async def sleep(level: int = 1, mode: str = "abort",
                    tags: list[str] | None = Query(None)) -> Response:
        await engine.call_utility("sleep", level, mode, tags)
        return Response(status_code=200)

    @app.post("/wake_up")
    async def wake_up(tags: list[str] | None = Query(None)) -> Response:
        await engine.call_utility("wake_up", tags)
        return Response(status_code=200)

    @app.get("/is_sleeping")
    async def is_sleeping() -> JSONResponse:
        return JSONResponse({"is_sleeping": await engine.call_utility("is_sleeping")})

    @app.post("/reset_prefix_cache")
    async def reset_prefix_cache() -> Response:
        await engine.call_utility("reset_prefix_cache")
        return Response(status_code=200)

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request) -> JSONResponse:
        """vLLM's body: {"method": name, "args": [...], "kwargs": {...}, "timeout": null}."""
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "collective_rpc: the body must be a JSON object")
        if not isinstance(body, dict) or not isinstance(body.get("method"), str):
            return error_response(400, "method: a worker method's name is required", "method")
        args, kwargs = body.get("args", []), body.get("kwargs", {})
        if not isinstance(args, list):
            return error_response(400, "args: must be a JSON array", "args")
        if not isinstance(kwargs, dict):
            return error_response(400, "kwargs: must be a JSON object", "kwargs")
        if body.get("timeout") is not None:
            return error_response(400, "timeout: loom waits for every rank; leave it null",
                                  "timeout")
        results = await engine.call_utility("call_workers", body["method"], args, kwargs)
        return JSONResponse({"results": [_json_value(r) for r in results]})
