"""Guided decoding's host half (bitmasks, which requests get one) and device half (the
sampler masking disallowed tokens), without a model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loom.core.request import Request
from loom.core.structured_output import grammar_bitmasks, grammar_of, validate_guided
from loom.sampling_params import GuidedDecodingParams, SamplingParams
from loom.worker.sampler import Sampler, SamplingMetadata


def _bitmask(allowed: list[int], tokenizer_vocab: int) -> bytes:
    words = np.zeros((tokenizer_vocab + 31) // 32, dtype=np.uint32)
    for t in allowed:
        words[t // 32] |= np.uint32(1 << (t % 32))
    return words.tobytes()


def _sample(logits: torch.Tensor, params: list[SamplingParams], masks: list[bytes | None]):
    n, vocab = logits.shape
    md = SamplingMetadata.build(params, [[] for _ in range(n)], [[0] for _ in range(n)],
                                [set() for _ in range(n)], [p.seed for p in params], "cpu",
                                vocab, masks)
    return Sampler()(logits.clone(), md).sampled_token_ids.tolist()


@pytest.mark.parametrize("model_vocab", [40, 100])
def test_sampler_keeps_allowed_tokens_only(model_vocab):
    # The tokenizer has 64 tokens: a larger model vocabulary is padded with disallowed ids,
    # a smaller one cuts the mask.
    logits = torch.zeros(3, model_vocab)
    logits[:, model_vocab - 1] = 100.0  # the favourite, outside every mask
    allowed = [5, 31, 33]
    mask = _bitmask(allowed, 64)
    greedy, seeded = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=1)
    tokens = _sample(logits, [greedy, seeded, greedy], [mask, mask, None])
    assert tokens[0] in allowed and tokens[1] in allowed
    assert tokens[2] == model_vocab - 1  # the unguided row is untouched
    logits[0, 31] = 50.0
    assert _sample(logits, [greedy], [mask])[0] == 31


def test_bitmasks_only_for_requests_that_sample():
    guided = SamplingParams(guided_decoding=GuidedDecodingParams(regex="a"))

    class _Grammar:
        def bitmask(self) -> bytes:
            return b"\xff" * 4

    reqs = [Request(f"r{i}", [1, 2, 3, 4], guided) for i in range(3)]
    for r in reqs[:2]:
        r.grammar = _Grammar()
    reqs[0].num_computed_tokens = 4  # its prefill reaches the end: it samples
    reqs[1].num_computed_tokens = 2  # a prefill chunk short of the end
    reqs[2].num_computed_tokens = 4  # unguided
    assert grammar_bitmasks(reqs) == {"r0": b"\xff" * 4}


def test_grammars_compile_or_name_the_field():
    assert grammar_of(GuidedDecodingParams(choice=['say "hi"', "a\\b"]))
    assert validate_guided(GuidedDecodingParams(json={"type": "object"}))
    with pytest.raises(ValueError, match="guided_decoding.json: not valid JSON"):
        validate_guided(GuidedDecodingParams(json="{"))
    with pytest.raises(ValueError, match="guided_decoding.regex"):
        validate_guided(GuidedDecodingParams(regex="[a-"))


def test_a_complete_grammar_ends_the_row_despite_min_tokens():
    """min_tokens masks the stop ids until enough tokens are out; a grammar that allows only
    a stop id has nothing else to offer, so the stop wins (masking both left no token, and
    the row sampled token 0)."""
    logits = torch.zeros(2, 64)
    logits[:, 0] = 100.0  # token 0: what an all -inf row would have sampled
    eos = 2
    params = [SamplingParams(temperature=0.0, min_tokens=3)] * 2
    masks = [_bitmask([eos], 64), _bitmask([eos, 7], 64)]
    md = SamplingMetadata.build(params, [[] for _ in range(2)], [[] for _ in range(2)],
                                [{eos}, {eos}], [None, None], "cpu", 64, masks)
    # Only EOS allowed: it ends. EOS or 7 allowed: min_tokens still masks EOS.
    assert Sampler()(logits.clone(), md).sampled_token_ids.tolist() == [eos, 7]
