"""The offline `LLM`'s pooling methods, as vLLM's: embed, classify, score and encode. Each
checks first that the model serves its task (`loom.tasks`), with vLLM's refusal otherwise."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import torch
from tqdm import tqdm

from loom.engine.protocol import EngineCoreRequest, ModelTasks
from loom.entrypoints.prompt_args import per_prompt, prompt_list, score_texts
from loom.frontend.processor import PromptType
from loom.outputs import (ClassificationOutput, ClassificationRequestOutput, EmbeddingOutput,
                          EmbeddingRequestOutput, PoolingOutput, PoolingRequestOutput,
                          ScoringRequestOutput)
from loom.pooling_params import PoolingParams, PoolingTask
from loom.scoring import (check_pairing, cross_encoder_output, cross_encoder_texts,
                          finish_logits, pair_token_ids, score_pairs)
from loom.tasks import unsupported

Pooled = list[tuple[EngineCoreRequest, list[float]]]
TOKEN_TASKS = ("encode", "token_embed", "token_classify")
"""vLLM's token-wise pooling tasks (a vector per prompt token): not built here."""


class PoolingMethods:
    """Mixed into `LLM`, whose engine, processor, tokenizer and tasks these use."""

    tasks: ModelTasks

    def embed(self, prompts: PromptType | Sequence[PromptType],
              pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
              use_tqdm: bool = True) -> list[EmbeddingRequestOutput]:
        """One pooled hidden state per prompt (text or token ids), in input order;
        pooling_params: one for all prompts, or one per prompt."""
        self.require("embed", "LLM.embed()")
        return [EmbeddingRequestOutput(r.request_id, EmbeddingOutput(v), r.prompt_token_ids)
                for r, v in self._pool(prompts, pooling_params, "embed", use_tqdm)]

    def classify(self, prompts: PromptType | Sequence[PromptType], *,
                 pooling_params: PoolingParams | Sequence[PoolingParams] | None = None,
                 use_tqdm: bool = True) -> list[ClassificationRequestOutput]:
        """A classification model's class probabilities for each prompt (text or token
        ids), in input order: softmax over the labels, sigmoid for one label (or as the
        config's problem_type says), the logits with use_activation=False."""
        self.require("classify", "LLM.classify()")
        return [ClassificationRequestOutput(
            r.request_id, ClassificationOutput(finish_logits(v, self.tasks, r.pooling_params)),
            r.prompt_token_ids) for r, v in self._pool(prompts, pooling_params, "classify",
                                                       use_tqdm)]

    def score(self, data_1: PromptType | Sequence[PromptType],
              data_2: PromptType | Sequence[PromptType], /, *,
              truncate_prompt_tokens: int | None = None, use_tqdm: bool = True,
              pooling_params: PoolingParams | None = None) -> list[ScoringRequestOutput]:
        """vLLM's score. data_1 one text (against each of data_2) or as many as data_2
        (pairwise); outputs in data_2's order. Cross-encoders (classifiers with one label)
        run each text pair as one sequence; embedding models score the cosine similarity of
        each pair's embeddings, each text embedded once, as `embed` embeds it."""
        self._check_open()
        first, second = score_texts(data_1, "data_1"), score_texts(data_2, "data_2")
        check_pairing(len(first), len(second), ("data_1", "data_2"))
        params = pooling_params or PoolingParams()
        if not isinstance(params, PoolingParams):
            raise ValueError(f"pooling_params: expected PoolingParams, got "
                             f"{type(params).__name__}")
        if truncate_prompt_tokens is not None:
            params = msgspec.structs.replace(params, truncate_prompt_tokens=truncate_prompt_tokens)
        if self.tasks.is_cross_encoder:
            return self._cross_encode(first, second, params, use_tqdm)
        embeds = self.embed(first + second, params, use_tqdm)
        pad = self.tokenizer.pad_token_id if self.tokenizer is not None else None
        return score_pairs(embeds[:len(first)], embeds[len(first):], pad)

    def _cross_encode(self, first: list, second: list, params: PoolingParams,
                      use_tqdm: bool) -> list[ScoringRequestOutput]:
        self.require("score", "LLM.score()")
        pairs = cross_encoder_texts(first, second, ("data_1", "data_2"))
        if self.tokenizer is None:
            raise ValueError("data_1: a cross-encoder tokenizes each pair, and "
                             "skip_tokenizer_init left no tokenizer")
        prompts = [pair_token_ids(self.tokenizer, self.tasks, a, b) for a, b in pairs]
        return [cross_encoder_output(r.request_id, v, r.prompt_token_ids, self.tasks,
                                     r.pooling_params)
                for r, v in self._pool(prompts, params, "score", use_tqdm)]

    def encode(self, prompts: PromptType | Sequence[PromptType],
               pooling_params: PoolingParams | Sequence[PoolingParams] | None = None, *,
               use_tqdm: bool = True,
               pooling_task: str | None = None) -> list[PoolingRequestOutput]:
        """vLLM's raw pooling, /pooling's offline twin: per prompt the pooler's output for
        pooling_task as a float32 tensor, as `embed` ("embed") or `classify` ("classify")
        computes it; None: the model's own task (classify for a classifier, else embed)."""
        task = pooling_task or self.tasks.own_pooling_task
        if task in TOKEN_TASKS:
            raise NotImplementedError(f"pooling_task: {task!r} pools every token, and loom's "
                                      "poolers give one vector per prompt (embed, classify)")
        if task not in ("embed", "classify"):
            raise ValueError(f"pooling_task: must be embed or classify (None: the model's "
                             f"own), got {task!r}")
        self.require(task, "LLM.encode()")
        pooled = self._pool(prompts, pooling_params, task, use_tqdm)
        return [PoolingRequestOutput(r.request_id, PoolingOutput(torch.tensor(
            v if task == "embed" else finish_logits(v, self.tasks, r.pooling_params),
            dtype=torch.float32)), r.prompt_token_ids) for r, v in pooled]

    def require(self, task: str, api: str) -> None:
        """vLLM's refusal (a ValueError) of a method whose task the model does not serve."""
        if not self.tasks.supports(task):
            raise ValueError(unsupported(self.tasks, task, api))

    def _pool(self, prompts, pooling_params, task: PoolingTask, use_tqdm: bool) -> Pooled:
        """Run one pooling request per prompt (all checked before any is added) for task;
        each request with what its engine output pooled."""
        self._check_open()
        self._check_awake()
        prompts = prompt_list(prompts)
        params = per_prompt(pooling_params, len(prompts), PoolingParams, "pooling_params")
        requests = []
        for prompt, p in zip(prompts, params):
            text, ids = self.processor.tokenize(prompt)
            p = p if p.task == task else msgspec.structs.replace(p, task=task)
            requests.append(self.processor.process_pooling(str(next(self._ids)), ids, p,
                                                           text=text is not None))
        with self._abort_on_error():
            for request in requests:
                self.engine.add_request(request)
            pooled = self._run_pooling(len(requests), use_tqdm)
        return [(r, pooled[r.request_id]) for r in requests]

    def _run_pooling(self, count: int, use_tqdm: bool) -> dict[str, list[float]]:
        pooled: dict[str, list[float]] = {}
        with tqdm(total=count, desc="Pooled prompts", disable=not use_tqdm) as bar:
            while len(pooled) < count:
                for out in self.engine.step().outputs:
                    if out.pooled is None:
                        raise RuntimeError(f"request {out.request_id} ended "
                                           f"({out.finish_reason}) without a pooled vector")
                    pooled[out.request_id] = out.pooled
                    bar.update(1)
        return pooled
