"""POST /score and /rerank: vLLM's scoring. Embedding (bi-encoder) models: each text is one
embedding request, as /v1/embeddings sends it; a pair's score is the cosine similarity of
its two vectors. Cross-encoders (classifiers with one label): each pair is one request of
the tokenizer's pair encoding; its score is the logit through the model's activation
(`loom.scoring`, plain Python)."""

from __future__ import annotations

import msgspec

from loom.entrypoints.openai.errors import APIError
from loom.entrypoints.openai.protocol import UsageInfo
from loom.entrypoints.openai.protocol_score import (RerankDocument, RerankRequest,
                                                    RerankResponse, RerankResult, RerankUsage,
                                                    ScoreRequest, ScoreResponse,
                                                    ScoreResponseData)
from loom.entrypoints.openai.serving_base import OpenAIServing, gather_or_cancel, off_loop
from loom.outputs import ScoringRequestOutput
from loom.pooling_params import PoolingParams
from loom.scoring import (check_pairing, cross_encoder_output, cross_encoder_texts,
                          pair_token_ids, score_pairs)


class OpenAIServingScore(OpenAIServing):
    async def score(self, body: ScoreRequest) -> ScoreResponse:
        model = self._model(body.model)
        request_id = self.new_id("score")
        first, second = body.texts()
        outputs = await self._score(request_id, first, second, body.side_names,
                                    body.to_pooling_params())
        data = [ScoreResponseData(index=i, score=out.outputs.score)
                for i, out in enumerate(outputs)]
        num_tokens = _num_tokens(outputs)
        return ScoreResponse(id=request_id, model=model, data=data,
                             usage=UsageInfo(prompt_tokens=num_tokens, total_tokens=num_tokens))

    async def rerank(self, body: RerankRequest) -> RerankResponse:
        """Jina's rerank API, as vLLM serves it: results by relevance, best first."""
        model = self._model(body.model)
        request_id = self.new_id("rerank")
        outputs = await self._score(request_id, [body.query], body.documents,
                                    ("query", "documents"), body.to_pooling_params())
        results = [RerankResult(index=i, relevance_score=out.outputs.score,
                                document=RerankDocument(text=body.documents[i])
                                if body.return_documents else None)
                   for i, out in enumerate(outputs)]
        results.sort(key=lambda r: r.relevance_score, reverse=True)
        if body.top_n:
            results = results[:body.top_n]
        num_tokens = _num_tokens(outputs)
        return RerankResponse(id=request_id, model=model, results=results,
                              usage=RerankUsage(prompt_tokens=num_tokens,
                                                total_tokens=num_tokens))

    def _model(self, name: str | None) -> str:
        model, lora = self.resolve_model(name)
        if lora is not None:  # as /v1/embeddings refuses them
            raise APIError(400, f"LoRA adapters are not supported for scoring: `{model}` is "
                                "one; use the base model's name", "model")
        return model

    async def _score(self, request_id: str, first: list[str], second: list[str],
                     names: tuple[str, str], params: PoolingParams) -> list[ScoringRequestOutput]:
        """Score the pairs (all checked before any runs): a cross-encoder runs each pair;
        otherwise every text is embedded once."""
        check_pairing(len(first), len(second), names)
        if self.tokenizer is None:
            raise APIError(400, "scoring takes text, and this server has no tokenizer",
                           names[0])
        if self.engine.tasks.is_cross_encoder:
            return await self._cross_encode(request_id, first, second, names, params)
        texts = first + second
        fields = [_field(names[0], i, len(first)) for i in range(len(first))]
        fields += [_field(names[1], i, len(second)) for i in range(len(second))]
        prompts = await off_loop(lambda: [self.engine.tokenize(t)[1] for t in texts])
        for i, (ids, field) in enumerate(zip(prompts, fields)):
            try:
                self.engine.processor.process_pooling(f"{request_id}-{i}", ids, params)
            except ValueError as e:  # the processor names its field "input"
                raise APIError(400, f"{field}: {str(e).partition(': ')[2]}",
                               field.partition("[")[0]) from None
        embeds = await gather_or_cancel([self.engine.encode(ids, params, f"{request_id}-{i}")
                                         for i, ids in enumerate(prompts)])
        return score_pairs(embeds[:len(first)], embeds[len(first):],
                           self.tokenizer.pad_token_id)

    async def _cross_encode(self, request_id: str, first: list[str], second: list[str],
                            names: tuple[str, str], params: PoolingParams
                            ) -> list[ScoringRequestOutput]:
        """One request per (query, document) pair, the pair tokenized as one sequence."""
        tasks, params = self.engine.tasks, msgspec.structs.replace(params, task="score")
        pairs = cross_encoder_texts(first, second, names)
        prompts = await off_loop(lambda: [pair_token_ids(self.tokenizer, tasks, a, b)
                                          for a, b in pairs])
        for i, ids in enumerate(prompts):
            try:
                self.engine.processor.process_pooling(f"{request_id}-{i}", ids, params)
            except ValueError as e:  # the pair is too long
                field = _longer_text(pairs[i], i, names, len(first), len(second))
                raise APIError(400, f"{field}: {str(e).partition(': ')[2]}",
                               field.partition("[")[0]) from None
        outs = await gather_or_cancel([self.engine.pool(ids, params, f"{request_id}-{i}")
                                       for i, ids in enumerate(prompts)])
        return [cross_encoder_output(r.request_id, logits, r.prompt_token_ids, tasks, params)
                for r, logits in outs]


def _field(name: str, index: int, count: int) -> str:
    """How an error names one text: the field, with its index where the field is a list."""
    return name if count == 1 else f"{name}[{index}]"


def _longer_text(pair: tuple[str, str], index: int, names: tuple[str, str], num_1: int,
                 num_2: int) -> str:
    """How an error names a pair: by its longer text, with that text's index."""
    if len(pair[0]) > len(pair[1]):
        return _field(names[0], index if num_1 > 1 else 0, num_1)
    return _field(names[1], index, num_2)


def _num_tokens(outputs: list[ScoringRequestOutput]) -> int:
    """vLLM's usage: each pair's tokens (its first text's, a pad, its second's)."""
    return sum(len(out.prompt_token_ids) for out in outputs)
