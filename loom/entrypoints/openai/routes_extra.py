"""Two of vLLM's server options: --middleware (ASGI middleware of the operator's, by import
path) and --enable-tokenizer-info-endpoint (GET /tokenizer_info)."""

from __future__ import annotations

import importlib
import inspect
import json
import os

from fastapi import FastAPI
from fastapi.responses import JSONResponse


def import_middleware(path: str):
    """The class or coroutine function `module.name` names; ValueError naming the flag for
    one that does not import or is neither."""
    module, _, name = path.rpartition(".")
    if not module:
        raise ValueError(f"middleware: must be an import path module.name, got {path!r}")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"middleware: cannot import {path!r}: {e}") from None
    if not (inspect.isclass(found) or inspect.iscoroutinefunction(found)):
        raise ValueError(f"middleware: {path!r} must be an ASGI middleware class or an async "
                         "function (request, call_next)")
    return found


def add_user_middleware(app: FastAPI, paths: list[str]) -> None:
    """As vLLM adds them: a class with app.add_middleware, a function as an "http"
    middleware; added last, so each is outside loom's own (the API key's included)."""
    for path in paths:
        found = import_middleware(path)
        if inspect.isclass(found):
            app.add_middleware(found)
        else:
            app.middleware("http")(found)


def tokenizer_info(tokenizer_dir: str | None, chat_template: str | None) -> dict:
    """vLLM's /tokenizer_info: the tokenizer's tokenizer_config.json, with its class and the
    chat template the server renders with."""
    config = {}
    if tokenizer_dir is not None and os.path.isfile(tokenizer_dir):  # a tokenizer.json
        tokenizer_dir = os.path.dirname(tokenizer_dir)
    path = os.path.join(tokenizer_dir, "tokenizer_config.json") if tokenizer_dir else None
    if path is not None and os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    config.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
    if chat_template is not None:
        config["chat_template"] = chat_template
    return config


def add_tokenizer_info(app: FastAPI, tokenizer_dir: str | None, chat_template) -> None:
    @app.get("/tokenizer_info")
    async def get_tokenizer_info() -> JSONResponse:
        return JSONResponse(tokenizer_info(tokenizer_dir, chat_template()))
