"""The pooling routes: /v1/embeddings, /classify, /pooling, /score and /rerank (and the paths where vLLM
also serves them). vLLM registers each only where the model serves its task, so that a
request for another task finds no route (404); loom answers the same 404 with an OpenAI
error body saying what the model serves (`require`), for the generation routes too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request

from loom.engine.protocol import ModelTasks
from loom.entrypoints.openai.errors import APIError
from loom.entrypoints.openai.protocol_classify import (ClassificationRequest,
                                                       ClassificationResponse)
from loom.entrypoints.openai.protocol import UsageInfo
from loom.entrypoints.openai.protocol_embeddings import (EmbeddingRequest, EmbeddingResponse,
                                                         PoolingInputRequest)
from loom.entrypoints.openai.protocol_pooling import (PoolingData, PoolingRequest,
                                                      PoolingResponse)
from loom.entrypoints.openai.protocol_score import (RerankRequest, RerankResponse,
                                                    ScoreRequest, ScoreResponse)
from loom.entrypoints.openai.serving_base import off_loop, run_unless_disconnected
from loom.entrypoints.openai.serving_embedding import encode_base64
from loom.tasks import unsupported

if TYPE_CHECKING:
    from loom.entrypoints.openai.server_state import ServerState


def require(tasks: ModelTasks, task: str, api: str) -> None:
    """A 404 naming what the model serves, where vLLM has no route for the task."""
    if not tasks.supports(task):
        raise APIError(404, unsupported(tasks, task, api), "model")


def _require_scoring(tasks: ModelTasks, api: str) -> None:
    """vLLM scores with cross-encoders (the score task) and with embedding models."""
    require(tasks, "score" if tasks.is_cross_encoder else "embed", api)


def add_pooling_routes(app: FastAPI, state: ServerState) -> None:
    tasks = state.engine.tasks

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request) -> EmbeddingResponse:
        require(tasks, "embed", "Embeddings API")
        await _render_messages(state, body)
        return await run_unless_disconnected(request, state.embeddings.create(body))

    @app.post("/classify")
    async def classify(body: ClassificationRequest, request: Request) -> ClassificationResponse:
        require(tasks, "classify", "Classification API")
        await _render_messages(state, body)
        return await run_unless_disconnected(request, state.classify.create(body))

    @app.post("/pooling")
    async def pooling(body: PoolingRequest, request: Request) -> PoolingResponse:
        task = body.task or tasks.own_pooling_task
        require(tasks, task, "Pooling API")
        await _render_messages(state, body)
        return await run_unless_disconnected(request, _pool(state, body, task))

    _add_score_routes(app, state)


async def _render_messages(state: ServerState, body: PoolingInputRequest) -> None:
    """vLLM's chat form of a pooling request: its conversation, as the chat template
    renders it, becomes the one input (token ids)."""
    if body.messages is None:
        return
    state.chat.check_request_template(body.chat_template)
    body.input = await off_loop(state.chat.render, body.messages, body.add_generation_prompt,
                                body.continue_final_message, body.template_variables,
                                body.chat_template)
    body.messages = None


async def _pool(state: ServerState, body: PoolingRequest, task: str) -> PoolingResponse:
    """/pooling through the embedding or classification serving, in vLLM's shape."""
    if task == "embed":
        out = await state.embeddings.create(body.as_embedding())
        data = [PoolingData(index=d.index, data=d.embedding) for d in out.data]
    else:
        out = await state.classify.create(body.as_classification())
        data = [PoolingData(index=d.index, data=encode_base64(d.probs)
                            if body.encoding_format == "base64" else d.probs)
                for d in out.data]
    tokens = out.usage.prompt_tokens
    return PoolingResponse(id="pool-" + out.id.split("-", 1)[1], model=out.model, data=data,
                           usage=UsageInfo(prompt_tokens=tokens, total_tokens=tokens))


def _add_score_routes(app: FastAPI, state: ServerState) -> None:
    """vLLM's paths: /score and /rerank, and where vLLM also serves them."""
    tasks = state.engine.tasks

    async def score(body: ScoreRequest, request: Request) -> ScoreResponse:
        _require_scoring(tasks, "Score API")
        return await run_unless_disconnected(request, state.scores.score(body))

    async def rerank(body: RerankRequest, request: Request) -> RerankResponse:
        _require_scoring(tasks, "Rerank API")
        return await run_unless_disconnected(request, state.scores.rerank(body))

    for path in ("/score", "/v1/score"):
        app.post(path, response_model_exclude_none=True)(score)
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        # exclude_none: a result without its document (return_documents false) has no key
        app.post(path, response_model_exclude_none=True)(rerank)
