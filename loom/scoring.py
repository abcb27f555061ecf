"""Scoring (query, document) pairs as vLLM scores them. Embedding models (bi-encoders):
each text is embedded once, a pair's score is the cosine similarity of its two vectors.
Classifiers with one label (cross-encoders, `ModelTasks.is_cross_encoder`): each pair runs
through the model as one sequence, its score is the logit through the model's activation.
Plain Python on the pooled lists, so the API server (never torch) uses it too."""

from __future__ import annotations

import math
from collections.abc import Sequence

from loom.engine.protocol import ModelTasks
from loom.frontend.tokenizer import Tokenizer
from loom.outputs import EmbeddingRequestOutput, ScoringOutput, ScoringRequestOutput
from loom.pooling_params import PoolingParams
from loom.tasks import activate

_EPS = 1e-8
"""Below this product of norms, the norm product is taken as this (as torch's cosine)."""


def cosine_similarity(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"vectors of {len(a)} and {len(b)} dimensions have no cosine")
    dot = math.fsum(x * y for x, y in zip(a, b))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / max(norms, _EPS)


def check_pairing(num_1: int, num_2: int, names: tuple[str, str]) -> None:
    """vLLM's pairings: 1:1, 1:N (the first text against each of the second) or N:N
    (pairwise); a ValueError naming the field otherwise."""
    first, second = names
    if num_1 == 0:
        raise ValueError(f"{first}: must not be empty")
    if num_2 == 0:
        raise ValueError(f"{second}: must not be empty")
    if num_1 > 1 and num_1 != num_2:
        raise ValueError(f"{first}: {num_1} texts for {num_2} in {second}; give one text "
                         f"(scored against each of {second}) or one per text of {second}")


def score_pairs(embeds_1: list[EmbeddingRequestOutput], embeds_2: list[EmbeddingRequestOutput],
                pad_token_id: int | None) -> list[ScoringRequestOutput]:
    """One output per pair, in the order of embeds_2; one first embedding pairs with all."""
    if len(embeds_1) == 1:
        embeds_1 = embeds_1 * len(embeds_2)
    pad = [] if pad_token_id is None else [pad_token_id]
    return [ScoringRequestOutput(
        f"{a.request_id}_{b.request_id}",
        ScoringOutput(cosine_similarity(a.outputs.embedding, b.outputs.embedding)),
        a.prompt_token_ids + pad + b.prompt_token_ids) for a, b in zip(embeds_1, embeds_2)]


def pair_token_ids(tokenizer: Tokenizer, tasks: ModelTasks, text_1: str, text_2: str) -> list[int]:
    """A cross-encoder's one sequence for a pair, as vLLM builds it: the tokenizer's pair
    encoding (its special tokens and separators), or with use_sep_token false in the config
    (vLLM's "LLM as reranker") the two texts joined and tokenized as one."""
    if tasks.use_sep_token:
        return tokenizer.encode_pair(text_1, text_2)
    return tokenizer.encode(text_1 + text_2)


def finish_logits(logits: list[float], tasks: ModelTasks, params: PoolingParams) -> list[float]:
    """A classify or score request's logits through the model's activation for its task,
    or as they are with use_activation false (vLLM's)."""
    wanted = tasks.use_activation if params.use_activation is None else params.use_activation
    if not wanted:
        return list(logits)
    return activate(logits, tasks.score_activation if params.task == "score"
                    else tasks.classify_activation)


def cross_encoder_output(request_id: str, logits: list[float], prompt_token_ids: list[int],
                         tasks: ModelTasks, params: PoolingParams) -> ScoringRequestOutput:
    return ScoringRequestOutput(request_id, ScoringOutput(finish_logits(logits, tasks, params)[0]),
                                prompt_token_ids)


def cross_encoder_texts(first: list, second: list, names: tuple[str, str]) -> list[tuple[str, str]]:
    """The (query, document) text pairs, one per second-side text; a ValueError naming the
    side for anything but text (a pair is tokenized as one sequence)."""
    for texts, name in ((first, names[0]), (second, names[1])):
        for text in texts:
            if not isinstance(text, str):
                raise ValueError(f"{name}: a cross-encoder scores text pairs, which the "
                                 f"tokenizer joins; got {type(text).__name__}")
    return list(zip(first * len(second) if len(first) == 1 else first, second))
