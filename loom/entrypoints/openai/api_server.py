"""The API server: a FastAPI app on uvicorn (uvloop), over an `AsyncLLM`.

Routes: /v1/completions, /v1/chat/completions, /v1/responses (and GET /v1/responses/{id},
POST /v1/responses/{id}/cancel), /v1/embeddings, /classify, /score and /rerank (vLLM's, also
under /v1/ and /v2/rerank; `routes_pooling`), /v1/models, /health (and SageMaker's /ping),
/invocations (SageMaker's: the route a body's fields name), /version, /tokenize,
/detokenize, /metrics, /load (and /_loom/introspect for tests, with LOOM_TEST_INTROSPECTION=1;
/v1/load_lora_adapter and /v1/unload_lora_adapter with LOOM_ALLOW_RUNTIME_LORA_UPDATING).
This module, like everything the API process imports, stays torch-free.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from loom import __version__, envs
from loom.entrypoints.openai.errors import error_response, install_exception_handlers
from loom.entrypoints.openai.middleware import (APIKeyMiddleware, BodySizeLimitMiddleware,
                                                InvocationsMiddleware,
                                                RequestIdHeaderMiddleware)
from loom.entrypoints.openai.protocol import (LoadLoRAAdapterRequest, ModelList,
                                              UnloadLoRAAdapterRequest)
from loom.entrypoints.openai.protocol_completions import CompletionRequest
from loom.entrypoints.openai.protocol_chat import (ChatCompletionRequest, DetokenizeRequest,
                                                   DetokenizeResponse, TokenizeRequest,
                                                   TokenizeResponse)
from loom.entrypoints.openai.routes_dev import add_dev_routes
from loom.entrypoints.openai.routes_extra import add_tokenizer_info, add_user_middleware
from loom.entrypoints.openai.server_load import add_server_load
from loom.entrypoints.openai.server_state import ServerState, build_state, close_state
from loom.entrypoints.openai.routes_pooling import add_pooling_routes, require
from loom.entrypoints.openai.serving_base import off_loop, run_unless_disconnected
from loom.entrypoints.openai.protocol_responses import ResponsesRequest
from loom.entrypoints.openai.protocol_score import SCORE_PAIRS
from loom.entrypoints.openai.serving_models import LoRAModule
from loom.frontend.async_llm import EngineDeadError
from loom.frontend.core_client import EngineCoreClient, InprocClient
from loom.frontend.tokenizer import Tokenizer

logger = logging.getLogger(__name__)

_GRACEFUL_SHUTDOWN_S = 5


class ServerOptions(msgspec.Struct, frozen=True):
    """The API server's own settings; msgspec, so they reach spawned API processes as JSON."""
    model: str
    served_model_names: list[str]
    tokenizer: str | None
    """Path of the tokenizer to load; None serves token ids only."""
    host: str = "127.0.0.1"
    port: int = 8000
    chat_template: str | None = None
    api_key: str | None = None
    log_stats: bool = True
    access_log: bool = True
    uvicorn_log_level: str = "info"
    """uvicorn's own loggers' level (debug, info, warning, error, critical, trace)."""
    log_requests: bool = False
    """--enable-log-requests: one INFO line per request with its id, params and prompt."""
    max_log_len: int | None = None
    """How much of a logged prompt to show (characters and token ids); None: all of it."""
    generation_config: str = "auto"
    """ModelConfig.generation_config: where unset sampling fields' defaults come from."""
    max_body_bytes: int = 10 * 1024 * 1024
    api_server_count: int = 1
    otlp_traces_endpoint: str | None = None
    """OTLP/HTTP collector for one `llm_request` span per request; None: no tracing."""
    tool_call_parser: str | None = None
    """What tool_choice "auto" reads calls with (--enable-auto-tool-choice); None: refused."""
    tool_parser_plugin: str | None = None
    """--tool-parser-plugin: a file each API server process runs before serving."""
    reasoning_parser: str | None = None
    """How thinking is split from the answer (--reasoning-parser); None: all is content."""
    trust_request_chat_template: bool = False
    """A chat request may bring its own chat_template (--trust-request-chat-template)."""
    allowed_origins: list[str] = msgspec.field(default_factory=lambda: ["*"])
    """CORS, as vLLM's defaults: any origin, method and header; no credentials."""
    allowed_methods: list[str] = msgspec.field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = msgspec.field(default_factory=lambda: ["*"])
    allow_credentials: bool = False
    ssl_keyfile: str | None = None
    """TLS (vLLM's --ssl-* flags, handed to uvicorn); None: plain HTTP."""
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0
    enable_prompt_tokens_details: bool = False
    """usage.prompt_tokens_details.cached_tokens in responses, as vLLM's flag."""
    return_tokens_as_token_ids: bool = False
    """logprobs' tokens as "token_id:<id>" where a request leaves it unset (vLLM's flag)."""
    force_include_usage: bool = False
    """--enable-force-include-usage: every completions / chat stream ends with usage."""
    request_id_headers: bool = False
    """--enable-request-id-headers: X-Request-Id on every response."""
    uds: str | None = None
    """--uds: serve on this Unix domain socket; host and port unused."""
    middleware: list[str] = msgspec.field(default_factory=list)
    """--middleware: import paths of ASGI middleware classes or async functions, added
    outside loom's own (`routes_extra.add_user_middleware`)."""
    tokenizer_info: bool = False
    """--enable-tokenizer-info-endpoint: GET /tokenizer_info."""
    log_error_stack: bool = False
    """--log-error-stack: every error answer's stack trace logged, not only a 500's."""
    exclude_tools_when_tool_choice_none: bool = False
    """--exclude-tools-when-tool-choice-none: tool_choice "none" renders no tools."""
    log_outputs: bool = False
    """--enable-log-outputs: with log_requests, each finished generation logged too."""
    lora_modules: list[LoRAModule] = msgspec.field(default_factory=list)
    """--lora-modules: adapters a request's `model` may name, ids 1, 2, ... in this order."""
    runtime_lora_updating: bool = False
    """POST /v1/load_lora_adapter and /v1/unload_lora_adapter (LOOM_ALLOW_RUNTIME_LORA_UPDATING;
    one API server only, as each keeps its own list)."""
    override_generation_config: dict = msgspec.field(default_factory=dict)
    """ModelConfig.override_generation_config: set over generation_config's defaults."""
    response_role: str = "assistant"
    chat_template_content_format: str = "auto"
    """vLLM's --response-role and --chat-template-content-format (`OpenAIServingChat`)."""
    root_path: str = ""
    """FastAPI's root_path: the path prefix a proxy serves the API under."""
    fastapi_docs: bool = True
    """/docs, /redoc and /openapi.json (off with --disable-fastapi-docs)."""
    server_load_tracking: bool = False
    """Count requests in flight for GET /load (--enable-server-load-tracking)."""
    default_chat_template_kwargs: dict[str, Any] = msgspec.field(default_factory=dict)
    """--default-chat-template-kwargs: chat template variables that a request's own
    chat_template_kwargs override, name by name."""
    stream_interval: int = 1
    """--stream-interval: a streamed choice goes out every this many tokens."""


def build_app(state: ServerState) -> FastAPI:
    options = state.options
    no_docs = dict(openapi_url=None, docs_url=None, redoc_url=None)
    app = FastAPI(title="loom", version=__version__, **({} if options.fastapi_docs else no_docs))
    app.root_path = options.root_path  # as vLLM sets it: a path with or without it routes
    install_exception_handlers(app, options.log_error_stack)
    _add_openai_routes(app, state)
    _add_server_routes(app, state)
    if state.options.runtime_lora_updating:
        _add_lora_routes(app, state)
    if envs.torch_profiler_dir() is not None:
        _add_profiler_routes(app, state)
    if envs.test_introspection():
        _add_introspection(app, state)
    if envs.server_dev_mode():
        add_dev_routes(app, state.engine)
    if options.tokenizer_info:
        add_tokenizer_info(app, options.tokenizer,
                           lambda: getattr(state.engine.tokenizer, "chat_template", None))
    add_server_load(app, options.server_load_tracking)
    if options.api_key:
        app.add_middleware(APIKeyMiddleware, api_key=options.api_key)
    app.add_middleware(InvocationsMiddleware, route=functools.partial(invocation_route,
                                                                      state.engine.tasks))
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=options.max_body_bytes)
    if options.request_id_headers:  # on every answer, refusals included
        app.add_middleware(RequestIdHeaderMiddleware)
    # Outermost: a browser's preflight carries no API key.
    app.add_middleware(CORSMiddleware, allow_origins=options.allowed_origins,
                       allow_methods=options.allowed_methods,
                       allow_headers=options.allowed_headers,
                       allow_credentials=options.allow_credentials)
    add_user_middleware(app, options.middleware)  # outermost, as vLLM's
    return app


def invocation_route(tasks, body) -> str:
    """Where SageMaker's /invocations sends a body, by its fields, as vLLM tries its request
    types: chat, completions, embeddings, classification, score, rerank."""
    if not isinstance(body, dict):
        raise ValueError(f"the body must be a JSON object, got {type(body).__name__}")
    pools = "embed" if tasks.supports("embed") else "classify"
    if "messages" in body:
        return "/v1/chat/completions" if tasks.supports("generate") else _POOL_PATHS[pools]
    if "prompt" in body:
        return "/v1/completions"
    if "input" in body:
        return _POOL_PATHS[pools]
    if "query" in body and "documents" in body:
        return "/rerank"
    if any(first in body for first, _ in SCORE_PAIRS):
        return "/score"
    raise ValueError("no route takes this body: it needs messages (chat), prompt "
                     "(completions), input (embeddings or classification), text_1 and text_2 "
                     "or another of score's pairs (score), or query and documents (rerank)")


_POOL_PATHS = {"embed": "/v1/embeddings", "classify": "/classify"}


def _add_openai_routes(app: FastAPI, state: ServerState) -> None:
    def trace_headers(request: Request) -> dict[str, str] | None:
        if state.options.otlp_traces_endpoint is None:
            return None  # no tracing, no cost
        from loom.tracing import extract_trace_headers
        return extract_trace_headers(request.headers)

    tasks = state.engine.tasks

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        require(tasks, "generate", "Completions API")
        return await run_unless_disconnected(
            request, state.completions.create(body, trace_headers(request),
                                              request.headers.get("x-request-id")))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        require(tasks, "generate", "Chat Completions API")
        return await run_unless_disconnected(
            request, state.chat.create(body, trace_headers(request),
                                       request.headers.get("x-request-id")))

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        require(tasks, "generate", "Responses API")
        return await run_unless_disconnected(
            request, state.responses.create(body, trace_headers(request)))

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str, stream: bool = False,
                                starting_after: int | None = None) -> Response:
        return await state.responses.retrieve(response_id, stream, starting_after)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> Response:
        return await state.responses.cancel(response_id)

    add_pooling_routes(app, state)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=state.models.cards(state.engine.max_model_len))


def _add_server_routes(app: FastAPI, state: ServerState) -> None:
    engine = state.engine

    @app.get("/health")
    @app.get("/ping")
    @app.post("/ping")
    async def health() -> Response:
        try:
            await engine.check_health()
        except EngineDeadError as e:
            return error_response(503, f"the engine is dead: {e}")
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict:
        return {"version": __version__}

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> TokenizeResponse:
        state.chat.check_model(body.model)
        if body.messages is not None:
            state.chat.check_request_template(body.chat_template)
            ids = await off_loop(state.chat.render, body.messages, body.add_generation_prompt,
                                 body.continue_final_message, body.template_variables,
                                 body.chat_template)
        else:
            ids = await off_loop(_need_tokenizer(engine.tokenizer).encode, body.prompt,
                                 body.add_special_tokens)
        strs = (_need_tokenizer(engine.tokenizer).convert_ids_to_tokens(ids)
                if body.return_token_strs else None)
        return TokenizeResponse(tokens=ids, count=len(ids), max_model_len=engine.max_model_len,
                                token_strs=strs)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> DetokenizeResponse:
        state.chat.check_model(body.model)
        bad = [t for t in body.tokens if t >= engine.vocab_size]
        if bad:
            raise ValueError(f"tokens: id(s) {bad[:5]} outside the vocabulary "
                             f"(0..{engine.vocab_size - 1})")
        # As vLLM (the tokenizer's own default): special tokens are text here too.
        return DetokenizeResponse(prompt=_need_tokenizer(engine.tokenizer).decode(
            body.tokens, skip_special_tokens=False))

    @app.get("/metrics")
    async def metrics() -> Response:
        body, content_type = state.metrics.render()
        return Response(body, media_type=content_type)


def _add_lora_routes(app: FastAPI, state: ServerState) -> None:
    """vLLM's runtime adapter endpoints; success is plain text, as vLLM answers."""
    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoRAAdapterRequest) -> Response:
        request = state.models.new_adapter(body.lora_name, body.lora_path)
        await off_loop(state.engine.processor.check_lora, request)  # reads its files
        state.models.register(request)
        logger.info("loaded LoRA adapter %s from %s", body.lora_name, body.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoRAAdapterRequest) -> Response:
        state.models.remove(body.lora_name)
        logger.info("unloaded LoRA adapter %s", body.lora_name)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed "
                                 "successfully.")


def _add_profiler_routes(app: FastAPI, state: ServerState) -> None:
    """vLLM's, with LOOM_TORCH_PROFILER_DIR set: torch.profiler on every engine rank from a
    start to its stop, each profile written to a new folder there."""
    logger.warning("torch.profiler routes on (LOOM_TORCH_PROFILER_DIR): /start_profile and "
                   "/stop_profile, for development only")

    @app.post("/start_profile")
    async def start_profile() -> Response:
        await state.engine.call_utility("profile", True)
        return Response(status_code=200)

    @app.post("/stop_profile")
    async def stop_profile() -> Response:
        await state.engine.call_utility("profile", False)
        return Response(status_code=200)


def _need_tokenizer(tokenizer: Tokenizer | None) -> Tokenizer:
    if tokenizer is None:
        raise ValueError("tokenizer: this server has none")
    return tokenizer


def _add_introspection(app: FastAPI, state: ServerState) -> None:
    engine = state.engine

    @app.get("/_loom/introspect")
    async def introspect() -> dict:
        tasks = len(asyncio.all_tasks())  # before this handler awaits anything
        return {"pid": os.getpid(), "engine_pid": engine.client.engine_pid or os.getpid(),
                "engine_pids": engine.client.engine_pids,
                "routed": getattr(engine.client, "routed", None),
                "torch_loaded": "torch" in sys.modules,
                "tasks": tasks, "streams": len(engine.streams),
                "tracked_engine_requests": len(engine.output_processor.children),
                "engine_unfinished": await engine.call_utility("get_num_unfinished_requests"),
                "kv": await engine.call_utility("get_kv_info")}

    @app.post("/_loom/crash_engine")
    async def crash_engine() -> JSONResponse:
        """Make an in-process engine's loop fail, as a process engine is killed."""
        if not isinstance(engine.client, InprocClient):
            return error_response(400, "the engine is a process: kill it")
        engine.client.inputs.put((0, RuntimeError("crashed on request (test)")))
        return JSONResponse({"crashed": True})


async def serve(options: ServerOptions, sock: socket.socket,
                make_client: Callable[[], EngineCoreClient],
                make_server: Callable[[uvicorn.Config], uvicorn.Server] = uvicorn.Server) -> int:
    """Serve until stopped; returns the exit code (1 once the engine has died)."""
    loop = asyncio.get_running_loop()
    server: uvicorn.Server | None = None

    def on_dead(reason: str) -> None:
        linger = envs.engine_dead_linger_s()
        logger.error("engine dead (%s); /health answers 503, exiting in %.1f s", reason, linger)
        loop.call_later(linger, setattr, server, "should_exit", True)

    state, tracer = build_state(options, make_client, on_dead)
    server = make_server(uvicorn.Config(
        build_app(state), loop="none", lifespan="off", log_config=None,
        log_level=options.uvicorn_log_level, access_log=options.access_log,
        timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S, ssl_keyfile=options.ssl_keyfile,
        ssl_certfile=options.ssl_certfile, ssl_ca_certs=options.ssl_ca_certs,
        ssl_cert_reqs=options.ssl_cert_reqs))
    state.engine.start()
    scheme = "https" if options.ssl_certfile else "http"
    where = (f"unix:{options.uds}" if options.uds
             else f"{scheme}://{options.host}:{options.port}")
    logger.info("API server %d serving %s at %s", os.getpid(),
                ", ".join([*options.served_model_names, *state.models.adapters]), where)
    try:
        await server.serve(sockets=[sock])
    finally:
        await close_state(state, tracer)
    return 1 if state.engine.errored else 0
