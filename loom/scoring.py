"""Scoring (query, document) pairs with an embedding model, as vLLM scores them for
bi-encoders: each text is embedded once, a pair's score is the cosine similarity of its two
vectors. Plain Python on the pooled lists, so the API server (never torch) uses it too."""

from __future__ import annotations

import math
from collections.abc import Sequence

from loom.outputs import EmbeddingRequestOutput, ScoringOutput, ScoringRequestOutput

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
