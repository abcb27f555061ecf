"""Every error the server returns, in OpenAI's shape: {"error": {message, type, param, code}}.

FastAPI's own 422 for an invalid body becomes a 400, as OpenAI answers; unknown routes and
methods keep their status with the same body shape.
"""

from __future__ import annotations

import http
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from loom.entrypoints.openai.protocol import ErrorInfo, ErrorResponse
from loom.frontend.async_llm import EngineDeadError

logger = logging.getLogger(__name__)

_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
          405: "MethodNotAllowedError", 413: "RequestTooLargeError",
          500: "InternalServerError", 503: "ServiceUnavailableError"}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param


def error_info(status: int, message: str, param: str | None = None) -> ErrorInfo:
    kind = _TYPES.get(status) or http.HTTPStatus(status).phrase.replace(" ", "") + "Error"
    return ErrorInfo(message=message, type=kind, param=param, code=status)


def error_body(status: int, message: str, param: str | None = None) -> bytes:
    return ErrorResponse(error=error_info(status, message, param)).model_dump_json().encode()


def error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse(ErrorResponse(error=error_info(status, message, param)).model_dump(),
                        status_code=status)


def exception_status(exc: BaseException) -> tuple[int, str, str | None]:
    """(status, message, param) for an exception raised while serving a request."""
    if isinstance(exc, APIError):
        return exc.status, exc.message, exc.param
    if isinstance(exc, EngineDeadError):
        return 500, f"the engine is dead: {exc}", None
    if isinstance(exc, ValueError):
        return 400, str(exc), _param_prefix(str(exc))
    return 500, f"internal error: {type(exc).__name__}: {exc}", None


def _param_prefix(message: str) -> str | None:
    """loom's messages start with the field they are about: "prompt: must not be empty"."""
    head, colon, _ = message.partition(":")
    return head if colon and head and " " not in head else None


def _field_path(loc: tuple) -> list[str]:
    """A pydantic error location as the request's field path: pydantic appends the member
    of a union that failed ("stop.str", "messages.0.content.list[...]"), which names no
    field, so the path stops before it."""
    path = []
    for part in loc:
        if part == "body":
            continue
        if isinstance(part, str) and (not part.isidentifier() or part in _UNION_MEMBERS):
            break
        path.append(str(part))
    return path


_UNION_MEMBERS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request body", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', first.get('msg'))}", None
    message = first.get("msg", "invalid value").removeprefix("Value error, ")
    param = ".".join(_field_path(first.get("loc", ()))) or _param_prefix(message)
    if param and message.startswith(f"{param}: "):
        message = message[len(param) + 2:]
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return (f"{param}: {message}" if param else message) + more, param


def install_exception_handlers(app: FastAPI, log_stack: bool = False) -> None:
    """log_stack (--log-error-stack): each error answer's stack trace is logged too."""
    def answer(exc: Exception, status: int, message: str, param: str | None) -> JSONResponse:
        if log_stack:
            logger.error("error answer %d: %s", status, message, exc_info=exc)
        return error_response(status, message, param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(APIError)
    async def _api(_request: Request, exc: APIError) -> JSONResponse:
        return answer(exc, exc.status, exc.message, exc.param)

    @app.exception_handler(ValueError)
    async def _value(_request: Request, exc: ValueError) -> JSONResponse:
        return answer(exc, *exception_status(exc))

    @app.exception_handler(EngineDeadError)
    async def _dead(_request: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(*exception_status(exc))

    @app.exception_handler(Exception)
    async def _internal(_request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unhandled error serving a request")
        return error_response(*exception_status(exc))
