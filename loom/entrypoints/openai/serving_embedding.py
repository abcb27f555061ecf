"""POST /v1/embeddings: each input's prompt pooled by the engine (last-token pooling,
L2-normalised by default), as floats or base64 float32."""

from __future__ import annotations

import base64
import struct

from loom.entrypoints.openai.errors import APIError
from loom.entrypoints.openai.protocol_embeddings import (EmbeddingData, EmbeddingRequest,
                                                         EmbeddingResponse, EmbeddingUsage)
from loom.entrypoints.openai.serving_base import OpenAIServing, gather_or_cancel, off_loop
from loom.outputs import EmbeddingRequestOutput


def encode_base64(vector: list[float]) -> str:
    """OpenAI's base64 format: the vector as little-endian float32 bytes."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class OpenAIServingEmbedding(OpenAIServing):
    async def create(self, body: EmbeddingRequest) -> EmbeddingResponse:
        model, lora = self.resolve_model(body.model)
        if lora is not None:
            raise APIError(400, f"LoRA adapters are not supported for embeddings: `{model}` is "
                                "one; use the base model's name", "model")
        params = body.to_pooling_params()
        request_id = self.new_id("embd")
        prompts = []
        tokenized = await off_loop(lambda: [self.engine.tokenize(p) for p in body.inputs])
        processor = self.engine.processor
        for i, (text, token_ids) in enumerate(tokenized):  # all valid, or none runs
            token_ids = processor.truncate(token_ids, params.truncate_prompt_tokens,
                                           text is not None)
            processor.process_pooling(f"{request_id}-{i}", token_ids, params)
            prompts.append(token_ids)
        outputs = await gather_or_cancel([self.engine.encode(ids, params, f"{request_id}-{i}")
                                          for i, ids in enumerate(prompts)])
        return self._response(request_id, model, body, outputs)

    @staticmethod
    def _response(request_id: str, model: str, body: EmbeddingRequest,
                  outputs: list[EmbeddingRequestOutput]) -> EmbeddingResponse:
        data = []
        for i, out in enumerate(outputs):
            vector = out.outputs.embedding
            embedding = encode_base64(vector) if body.encoding_format == "base64" else vector
            data.append(EmbeddingData(index=i, embedding=embedding))
        num_tokens = sum(len(out.prompt_token_ids) for out in outputs)
        return EmbeddingResponse(id=request_id, model=model, data=data,
                                 usage=EmbeddingUsage(prompt_tokens=num_tokens,
                                                      total_tokens=num_tokens))
