"""`ServerState`: the engine client and every endpoint's serving object, built from
`ServerOptions` and closed in order; `loom serve`'s API server and `loom run-batch` alike.
Torch-free, as everything the API process imports."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loom.entrypoints.openai.metrics import ServerMetrics
from loom.entrypoints.openai.responses_store import store_from_env
from loom.entrypoints.openai.serving_chat import OpenAIServingChat
from loom.entrypoints.openai.serving_classify import OpenAIServingClassification
from loom.entrypoints.openai.serving_completions import OpenAIServingCompletion
from loom.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
from loom.entrypoints.openai.serving_models import ServingModels
from loom.entrypoints.openai.serving_responses import OpenAIServingResponses
from loom.entrypoints.openai.serving_score import OpenAIServingScore
from loom.entrypoints.openai.tool_parser_plugin import load_tool_parser_plugin
from loom.frontend.async_llm import AsyncLLM
from loom.frontend.core_client import EngineCoreClient
from loom.frontend.request_logger import RequestLogger
from loom.frontend.tokenizer import Tokenizer, load_tokenizer
from loom.models.loader import generation_config_dir, generation_defaults

if TYPE_CHECKING:
    from loom.entrypoints.openai.api_server import ServerOptions

logger = logging.getLogger(__name__)


@dataclass
class ServerState:
    options: ServerOptions
    engine: AsyncLLM
    metrics: ServerMetrics
    models: ServingModels
    completions: OpenAIServingCompletion
    chat: OpenAIServingChat
    embeddings: OpenAIServingEmbedding
    responses: OpenAIServingResponses
    scores: OpenAIServingScore
    classify: OpenAIServingClassification


def build_state(options: ServerOptions, make_client: Callable[[], EngineCoreClient],
                on_dead: Callable[[str], None]):
    """The engine client and every endpoint's serving object (not started), and the tracer
    (None without tracing); `loom serve` and `loom run-batch` alike."""
    tokenizer = _load_tokenizer(options)
    metrics = ServerMetrics(options.served_model_names[0])
    tracer = _make_tracer(options)
    request_logger = (RequestLogger(tokenizer, options.max_log_len, options.log_outputs)
                      if options.log_requests
                      else None)
    engine = AsyncLLM(make_client(), tokenizer, metrics, on_dead, tracer, request_logger)
    models = ServingModels(options.served_model_names, options.model, options.lora_modules)
    defaults = generation_defaults(options.model, options.generation_config,
                                   options.override_generation_config)
    if defaults:
        logger.info("sampling defaults from generation_config.json: %s", defaults)
    details = options.enable_prompt_tokens_details
    if options.tool_parser_plugin:  # in every API server process: its parsers register
        load_tool_parser_plugin(options.tool_parser_plugin)
    # The Responses API's logprobs and usage are chat's.
    shared = dict(tokens_as_ids=options.return_tokens_as_token_ids,
                  force_include_usage=options.force_include_usage,
                  stream_interval=options.stream_interval)
    chat = OpenAIServingChat(engine, models, defaults, details, **shared,
                             tool_call_parser=options.tool_call_parser,
                             reasoning_parser=options.reasoning_parser,
                             trust_request_chat_template=options.trust_request_chat_template,
                             response_role=options.response_role,
                             content_format=options.chat_template_content_format,
                             default_template_kwargs=options.default_chat_template_kwargs,
                             exclude_tools_when_none=options.exclude_tools_when_tool_choice_none)
    completion = OpenAIServingCompletion(engine, models, defaults, details, **shared)
    state = ServerState(options, engine, metrics, models, completion, chat,
                        OpenAIServingEmbedding(engine, models),
                        OpenAIServingResponses(chat, store_from_env()),
                        OpenAIServingScore(engine, models),
                        OpenAIServingClassification(engine, models))
    return state, tracer


async def close_state(state: ServerState, tracer) -> None:
    """Stop what build_state made: background responses, the engine client, the tracer."""
    await state.responses.stop_background()
    await state.engine.close()
    if tracer is not None:
        tracer.shutdown()  # flushes the spans still batched


def _load_tokenizer(options: ServerOptions) -> Tokenizer | None:
    if options.tokenizer is None:
        return None
    return load_tokenizer(options.tokenizer, chat_template=options.chat_template,
                          generation_config=generation_config_dir(options.generation_config))


def _make_tracer(options: ServerOptions):
    if options.otlp_traces_endpoint is None:
        return None
    from loom.tracing import RequestTracer  # OpenTelemetry only when asked for
    return RequestTracer(options.otlp_traces_endpoint, options.served_model_names[0])
