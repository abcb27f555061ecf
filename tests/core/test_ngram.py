"""N-gram prompt lookup against a direct reading of its definition (vLLM's): for n from
prompt_lookup_max down to prompt_lookup_min, the first earlier occurrence of the last n
tokens; the draft is the k tokens after it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from loom.core.ngram import NgramProposer, find_draft


def reference(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n):  # windows that end before the last token
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_examples():
    # vLLM's docstring example: [4, 2, 3] has no earlier match, [2, 3] does.
    assert find_draft(np.array([1, 2, 3, 4, 2, 3]), 2, 3, 4) == [4, 2, 3]
    assert find_draft(np.array([1, 2, 3, 4, 2, 3]), 3, 3, 4) == []
    # The longest n wins over an earlier, shorter match.
    assert find_draft(np.array([7, 3, 9, 1, 2, 3, 8, 1, 2, 3]), 1, 3, 2) == [8, 1]
    assert find_draft(np.array([5]), 1, 3, 2) == []


@pytest.mark.parametrize("alphabet", [2, 3, 6])
def test_matches_the_definition_on_random_sequences(alphabet):
    rng = random.Random(alphabet)
    for _ in range(400):
        tokens = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 40))]
        min_n = rng.randrange(1, 4)
        max_n = rng.randrange(min_n, 6)
        k = rng.randrange(1, 6)
        assert find_draft(np.array(tokens), min_n, max_n, k) == \
            reference(tokens, min_n, max_n, k), (tokens, min_n, max_n, k)


def test_proposer_follows_growing_requests():
    rng = random.Random(1)
    proposer = NgramProposer(1, 3)
    histories = {"a": [rng.randrange(4) for _ in range(5)], "b": [1, 2]}
    for _ in range(200):
        rid = rng.choice("ab")
        histories[rid] += [rng.randrange(4) for _ in range(rng.randrange(1, 4))]
        assert proposer.propose(rid, histories[rid], 3) == reference(histories[rid], 1, 3, 3)
    proposer.drop("a")
    assert proposer.propose("a", [1, 1], 2) == [1]
    assert proposer.propose("b", histories["b"], 0) == []
