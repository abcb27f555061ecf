"""`loom serve [MODEL]`: the server's flags, vLLM's names, plus every engine flag."""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any

from loom import envs
from loom.engine.arg_utils import EngineArgs
from loom.config import EngineConfig, ModelConfig
from loom.config_checks import json_object
from loom.entrypoints.openai.protocol_chat import RESERVED_TEMPLATE_VARIABLES
from loom.entrypoints.openai.reasoning import REASONING_PARSERS
from loom.entrypoints.openai.serving_models import LoRAModule, lora_requests, parse_lora_modules
from loom.entrypoints.openai.tool_parser_plugin import check_tool_parser
from loom.frontend.chat_content import CONTENT_FORMATS
from loom.lora.adapter import model_targets, read_adapter
from loom.models.arch import ModelArch
from loom.models.loader import generation_defaults, resolve, shipped_config, tokenizer_path

logger = logging.getLogger(__name__)

DEMO_SERVED_NAME = "SmolLM2-135M-Instruct"
UVICORN_LOG_LEVELS = ("debug", "info", "warning", "error", "critical", "trace")
OTEL_TRACES_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
RUNTIME_LORA_ENV = "LOOM_ALLOW_RUNTIME_LORA_UPDATING"


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the model to serve (overrides --model; default: the demo model)")
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--uds", default=None, metavar="PATH",
                   help="serve on this Unix domain socket instead of --host/--port (vLLM's)")
    g.add_argument("--api-key", default=None,
                   help="require `Authorization: Bearer KEY` on /v1 routes (default: $LOOM_API_KEY)")
    for flag in ("--allowed-origins", "--allowed-methods", "--allowed-headers"):
        g.add_argument(flag, type=_json_list, default=["*"],
                       help="CORS: a JSON list (default [\"*\"], as vLLM)")
    g.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    g.add_argument("--ssl-keyfile", default=None, help="TLS: the key file (with --ssl-certfile)")
    g.add_argument("--ssl-certfile", default=None, help="TLS: the certificate file")
    g.add_argument("--ssl-ca-certs", default=None, help="TLS: CA certificates for clients")
    g.add_argument("--ssl-cert-reqs", type=int, default=0,
                   help="TLS: whether client certificates are required (Python's ssl.CERT_*)")
    g.add_argument("--enable-request-id-headers", action="store_true",
                   help="X-Request-Id on every response: the request's own, else a fresh "
                        "one (vLLM's)")
    g.add_argument("--api-server-count", type=int, default=1,
                   help="API server processes sharing the port (and the one engine core)")
    g.add_argument("--disable-uvicorn-access-log", action="store_true")
    g.add_argument("--uvicorn-log-level", default="info", choices=UVICORN_LOG_LEVELS,
                   help="the level of uvicorn's own log lines")
    g.add_argument("--max-request-body-bytes", type=int, default=10 * 1024 * 1024)
    g.add_argument("--root-path", default="",
                   help="the path prefix a proxy serves the API under (FastAPI's root_path)")
    g.add_argument("--disable-fastapi-docs", action="store_true",
                   help="serve no /docs, /redoc or /openapi.json")
    g.add_argument("--middleware", action="append", default=[], metavar="MODULE.NAME",
                   help="an ASGI middleware class or async function (request, call_next) to "
                   "add outside loom's own; repeatable")
    g.add_argument("--log-error-stack", action="store_true",
                   help="log each error answer's stack trace (a 500's always is)")
    g.add_argument("--enable-tokenizer-info-endpoint", action="store_true",
                   help="GET /tokenizer_info: the tokenizer's tokenizer_config.json and the "
                   "chat template")
    g.add_argument("--enable-server-load-tracking", action="store_true",
                   help="count the generation requests in flight here, for GET /load")
    g.add_argument("--otlp-traces-endpoint", default=None,
                   help="OTLP/HTTP collector URL (e.g. http://127.0.0.1:4318/v1/traces) that "
                        "gets one `llm_request` span per request (default: "
                        f"${OTEL_TRACES_ENV}); needs pip install 'loom[tracing]'")
    add_frontend_flags(p.add_argument_group("frontend (also `loom run-batch`'s)"))
    EngineArgs.add_cli_args(p)
    p.set_defaults(func=run_serve)


def add_frontend_flags(g) -> None:
    """The flags of how requests become prompts and answers, which `loom run-batch` shares."""
    g.add_argument("--served-model-name", nargs="+", default=None,
                   help="name(s) clients use for the model; the first is reported in responses")
    g.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, or a file holding one; overrides the model's")
    g.add_argument("--response-role", default="assistant",
                   help="the role of the reply to a chat request with add_generation_prompt")
    g.add_argument("--chat-template-content-format", default="auto", choices=CONTENT_FORMATS,
                   help="a message's content in the chat template: string (text parts joined "
                   "by newlines), openai (a list of parts); auto: openai if the template "
                   "loops over a message's content, else string (vLLM's detection)")
    g.add_argument("--enable-prompt-tokens-details", action="store_true",
                   help="usage says how many prompt tokens came from the prefix cache")
    g.add_argument("--enable-force-include-usage", action="store_true",
                   help="end every stream with a usage chunk, as stream_options' "
                        "include_usage asks (vLLM's)")
    g.add_argument("--return-tokens-as-token-ids", action="store_true",
                   help="logprobs name their tokens \"token_id:<id>\" unless a request sets "
                        "return_tokens_as_token_ids (vLLM's)")
    g.add_argument("--default-chat-template-kwargs", default=None, metavar="JSON",
                   help="chat template variables for every request, under its own "
                        "chat_template_kwargs, e.g. '{\"enable_thinking\": false}' (vLLM's)")
    g.add_argument("--stream-interval", type=int, default=1, metavar="N",
                   help="stream a choice's text every N tokens (its first and last at once) "
                        "rather than every step: less host work per token (vLLM's)")
    g.add_argument("--skip-tokenizer-init", action="store_true",
                   help="load no tokenizer: prompts must be token ids, outputs carry ids and "
                        "no text (vLLM's)")
    g.add_argument("--trust-request-chat-template", action="store_true",
                   help="let a chat request bring its own chat_template (a template is code)")
    g.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                   help="a chat whose tool_choice is \"none\" renders its template without "
                   "the tools (by default they reach it, as in vLLM)")
    g.add_argument("--expand-tools-even-if-tool-choice-none", action="store_true",
                   help="vLLM's former flag, accepted: the tools reach the template unless "
                   "--exclude-tools-when-tool-choice-none")
    g.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="let tool_choice \"auto\" (the default with tools) read the model's own "
                        "tool calls, with --tool-call-parser")
    g.add_argument("--tool-call-parser", default=None, metavar="NAME",
                   help="the model's tool-call syntax: hermes (Hermes, Qwen2.5, Qwen3), "
                        "llama3_json (Llama 3.1/3.2), pythonic (Llama 3.2/4), or a name "
                        "a --tool-parser-plugin file registers")
    g.add_argument("--tool-parser-plugin", default=None, metavar="FILE.py", help="a file "
                   "whose @register_tool_parser(name) classes (loom's interface) add names")
    g.add_argument("--reasoning-parser", default=None, choices=sorted(REASONING_PARSERS),
                   help="send a reasoning model's thinking in the message's `reasoning` field: "
                        "qwen3 (<think>...</think> first), deepseek_r1 (thinking until </think>)")
    g.add_argument("--disable-frontend-multiprocessing", action="store_true",
                   help="run the engine core in the API server process")
    g.add_argument("--disable-log-stats", action="store_true",
                   help="no periodic engine stats line")
    g.add_argument("--disable-log-requests", action=argparse.BooleanOptionalAction,
                   default=None, help="vLLM's older flag: no request logging, the default "
                   "(--no-disable-log-requests: --enable-log-requests)")
    g.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction, default=None,
                   help="log one INFO line per request: its id, sampling params and prompt")
    g.add_argument("--enable-log-outputs", action="store_true",
                   help="with --enable-log-requests, also one INFO line per finished "
                        "generation: its text, token ids and finish reason (vLLM's)")
    g.add_argument("--max-log-len", type=int, default=None,
                   help="with --enable-log-requests, log at most this many characters and "
                        "token ids of each prompt (default: all of it)")
    g.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME=PATH",
                   help="LoRA adapters to serve (with --enable-lora), each a name=path or vLLM's "
                        "JSON '{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'; "
                        "a request's `model` names one to run with it")


def _check_ssl(args: argparse.Namespace) -> None:
    """Load the TLS files here, so that a bad one is one line before the engine starts."""
    if args.ssl_keyfile is None and args.ssl_certfile is None:
        return
    if args.ssl_certfile is None:
        raise ValueError("ssl_certfile: --ssl-keyfile needs --ssl-certfile")
    import ssl
    try:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile)
        if args.ssl_ca_certs:
            context.load_verify_locations(args.ssl_ca_certs)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"ssl_certfile: cannot load the TLS files ({e})") from None


def _json_list(value: str) -> list[str]:
    """A CORS flag's value, as vLLM takes it: a JSON list of strings."""
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not (isinstance(parsed, list) and all(isinstance(v, str) for v in parsed)):
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings, e.g. "
                                         f"'[\"http://localhost:3000\"]', got {value!r}")
    return parsed


def run_serve(args: argparse.Namespace) -> int:
    from loom.entrypoints.openai.api_server import ServerOptions
    from loom.entrypoints.openai.launcher import run_server
    _check(args)
    traces_endpoint = _traces_endpoint(args)
    config, frontend = frontend_setup(args, "api_server")
    options = ServerOptions(
        **frontend, runtime_lora_updating=_runtime_lora_updating(args),
        host=args.host, port=args.port, api_key=args.api_key or envs.api_key(),
        access_log=not args.disable_uvicorn_access_log,
        uvicorn_log_level=args.uvicorn_log_level, root_path=_root_path(args.root_path),
        fastapi_docs=not args.disable_fastapi_docs,
        server_load_tracking=args.enable_server_load_tracking,
        max_body_bytes=args.max_request_body_bytes, api_server_count=args.api_server_count,
        otlp_traces_endpoint=traces_endpoint,
        allowed_origins=args.allowed_origins, allowed_methods=args.allowed_methods,
        allowed_headers=args.allowed_headers, allow_credentials=args.allow_credentials,
        ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs, ssl_cert_reqs=args.ssl_cert_reqs,
        request_id_headers=args.enable_request_id_headers, uds=args.uds,
        middleware=args.middleware, tokenizer_info=args.enable_tokenizer_info_endpoint,
        log_error_stack=args.log_error_stack)
    return run_server(options, config, inproc=args.disable_frontend_multiprocessing)


def frontend_setup(args: argparse.Namespace, context: str) -> tuple[EngineConfig, dict]:
    """The engine's config from the command line, and ServerOptions' fields that
    `add_frontend_flags` sets. What the frontend reads of the model (the generation config,
    the tokenizer and chat template, LoRA adapters) is checked now, so that a bad one is one
    line before the model loads."""
    check_frontend(args)
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    config = EngineArgs.from_cli_args(args).create_engine_config(context)
    if args.disable_frontend_multiprocessing:
        config.parallel.check_one_engine("--disable-frontend-multiprocessing")
    generation_defaults(config.model.model, config.model.generation_config,
                        config.model.override_generation_config)
    skip = args.skip_tokenizer_init
    tokenizer = None if skip else served_tokenizer(config.model)
    _check_tokenizer(tokenizer, args.chat_template, config.model.model, skip)
    served_names = _served_names(args)
    return config, dict(
        model=config.model.model, served_model_names=served_names,
        lora_modules=_lora_modules(args.lora_modules, served_names, config),
        tokenizer=tokenizer, chat_template=args.chat_template,
        log_stats=not args.disable_log_stats, log_requests=_log_requests(args),
        max_log_len=args.max_log_len, generation_config=config.model.generation_config,
        override_generation_config=config.model.override_generation_config,
        response_role=args.response_role,
        chat_template_content_format=args.chat_template_content_format,
        tool_call_parser=args.tool_call_parser if args.enable_auto_tool_choice else None,
        tool_parser_plugin=args.tool_parser_plugin,
        reasoning_parser=args.reasoning_parser,
        trust_request_chat_template=args.trust_request_chat_template,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
        force_include_usage=args.enable_force_include_usage,
        log_outputs=args.enable_log_outputs, stream_interval=args.stream_interval,
        default_chat_template_kwargs=default_template_kwargs(args.default_chat_template_kwargs),
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none)


def _check(args: argparse.Namespace) -> None:
    if args.api_server_count < 1:
        raise ValueError(f"api_server_count: must be at least 1, got {args.api_server_count}")
    if args.api_server_count > 1 and args.disable_frontend_multiprocessing:
        raise ValueError("api_server_count: several API servers need the engine core in its own "
                         "process; drop --disable-frontend-multiprocessing")
    if args.max_request_body_bytes < 1:
        raise ValueError("max_request_body_bytes: must be positive")
    _root_path(args.root_path)
    _check_ssl(args)
    if args.middleware:  # (imported here too, so that a bad path is one line before loading)
        from loom.entrypoints.openai.routes_extra import import_middleware
        for path in args.middleware:
            import_middleware(path)
    if getattr(args, "logits_processors", None):  # likewise
        from loom.logits_processor import load_classes
        load_classes(args.logits_processors)
    if not 0 <= args.port < 65536:
        raise ValueError(f"port: must be 0-65535, got {args.port}")


def check_frontend(args: argparse.Namespace) -> None:
    """`add_frontend_flags`' flags, checked before anything loads."""
    if args.max_log_len is not None and args.max_log_len < 0:
        raise ValueError(f"max_log_len: must be non-negative, got {args.max_log_len}")
    if args.enable_log_outputs and not _log_requests(args):
        raise ValueError("enable_log_outputs: --enable-log-outputs needs --enable-log-requests")
    check_tool_parser(args.tool_call_parser, args.tool_parser_plugin,
                      args.enable_auto_tool_choice)
    if args.lora_modules and not args.enable_lora:
        raise ValueError("lora_modules: --lora-modules needs --enable-lora")
    if args.stream_interval < 1:
        raise ValueError(f"stream_interval: --stream-interval must be at least 1, got "
                         f"{args.stream_interval}")
    default_template_kwargs(args.default_chat_template_kwargs)


def default_template_kwargs(value: str | None) -> dict[str, Any]:
    """--default-chat-template-kwargs: a JSON object of template variables."""
    flag = "default_chat_template_kwargs: --default-chat-template-kwargs"
    try:
        kwargs = json_object(value, flag) if value is not None else {}
    except ValueError:
        raise ValueError(f"{flag} takes a JSON object, got {value!r}"[:300]) from None
    reserved = sorted(set(RESERVED_TEMPLATE_VARIABLES) & set(kwargs))
    if reserved:
        raise ValueError(f"{flag} may not set {reserved}: each request sets them")
    return kwargs


def _log_requests(args: argparse.Namespace) -> bool:
    """--enable-log-requests and vLLM's older --disable-log-requests (each with its --no-
    form): off unless asked for; the two may both be given only when they agree."""
    said = {args.enable_log_requests,
            None if args.disable_log_requests is None else not args.disable_log_requests}
    said.discard(None)
    if len(said) > 1:
        raise ValueError("enable_log_requests: give --enable-log-requests or "
                         "--disable-log-requests, not both: they disagree")
    return said.pop() if said else False


def _root_path(root_path: str) -> str:
    """A prefix with a trailing slash would route nothing: the router strips it and wants
    the path's own slash after it."""
    if root_path and not root_path.startswith("/"):
        raise ValueError(f"root_path: must start with '/', got {root_path!r}")
    return root_path.rstrip("/")


def served_tokenizer(model: ModelConfig) -> str | None:
    """The tokenizer to serve with: --tokenizer, the model's own, or for a shipped Llama
    config (`loom serve llama-3.1-8b --load-format dummy`) the real Llama 3 tokenizer, as
    the benchmarks use; None if there is none (token-id prompts only)."""
    found = tokenizer_path(model)
    if found is None and shipped_config(model.model) is not None:
        from loom.bench.common import default_tokenizer
        try:
            found = default_tokenizer(model.model)
        except ValueError as e:  # the Llama 3 tokenizer package is not installed
            logger.warning("%s", e)
    return found


def _check_tokenizer(tokenizer: str | None, chat_template: str | None, model: str,
                     skipped: bool = False) -> None:
    """Load the tokenizer and chat template once here, so that a bad path or template is a
    one-line error now, not after the engine has loaded (and compiled) the model."""
    from loom.frontend.tokenizer import load_tokenizer
    if skipped:
        logger.info("skip_tokenizer_init: no tokenizer; only token-id prompts are served, and "
                    "outputs carry no text (ask for return_token_ids)")
    elif tokenizer is None:
        logger.warning("%s ships no tokenizer: only token-id prompts will work (pass --tokenizer)",
                       model)
    if tokenizer is None:
        if chat_template is not None:
            why = "--skip-tokenizer-init" if skipped else "the model ships none; pass --tokenizer"
            raise ValueError(f"chat_template: needs a tokenizer ({why})")
        return
    load_tokenizer(tokenizer, chat_template=chat_template)


def _lora_modules(items: list[str] | None, served_names: list[str],
                  config: EngineConfig) -> list[LoRAModule]:
    """--lora-modules, each adapter checked here as the engine checks it (torch-free), so
    that a bad one is one line naming it, not a failure once the model has loaded."""
    modules = parse_lora_modules(items or (), served_names)
    if not modules:
        return modules
    targets = model_targets(ModelArch.from_hf_config(resolve(config.model).hf_config))
    for request in lora_requests(modules):
        try:
            read_adapter(request, targets, config.lora.max_lora_rank)
        except ValueError as e:
            # read_adapter names the adapter ("lora_request 'sql' (/path): ...").
            raise ValueError(f"lora_modules: {str(e).removeprefix('lora_request ')}") from None
    return modules


def _runtime_lora_updating(args: argparse.Namespace) -> bool:
    """LOOM_ALLOW_RUNTIME_LORA_UPDATING (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING): serve
    POST /v1/load_lora_adapter and /v1/unload_lora_adapter."""
    allowed = envs.allow_runtime_lora_updating()
    if allowed and not args.enable_lora:
        logger.warning("%s is set, but without --enable-lora no adapter can be loaded",
                       RUNTIME_LORA_ENV)
        return False
    if allowed and args.api_server_count > 1:
        raise ValueError(f"api_server_count: {RUNTIME_LORA_ENV} needs one API server (each "
                         "keeps its own list of adapters); drop --api-server-count")
    if allowed:
        logger.warning("%s: clients may load LoRA adapters from this machine's disk at run "
                       "time; meant for development", RUNTIME_LORA_ENV)
    return allowed


def _traces_endpoint(args: argparse.Namespace) -> str | None:
    endpoint = args.otlp_traces_endpoint or os.environ.get(OTEL_TRACES_ENV) or None
    if endpoint is not None:
        from loom.tracing import check_tracing_available, traces_url
        check_tracing_available()
        traces_url(endpoint)  # a bad URL fails here, not in each API server process
    return endpoint


def _served_names(args: argparse.Namespace) -> list[str]:
    """--served-model-name, else --model as given (a Hub id, not its snapshot folder)."""
    if args.served_model_name:
        return list(args.served_model_name)
    if args.model is None:  # the demo model
        return [DEMO_SERVED_NAME]
    return [args.model]

