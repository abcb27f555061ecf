"""vLLM's --logprobs-mode on a tiny Llama (float32, CPU): each mode's values against
transformers' own logits for the same tokens, processed ones through transformers' own
logits warpers (temperature, top-k, top-p)."""

from __future__ import annotations

import pytest
import torch

from loom import LLM, SamplingParams

PROMPT = [5, 17, 42, 99, 3, 64]
TOKENS = 5


@pytest.fixture(scope="module")
def tiny(tiny_model_factory):
    return tiny_model_factory("llama")


def _llm(path: str, mode: str) -> LLM:
    return LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu",
               max_model_len=128, logprobs_mode=mode)


def _hf_logits(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """[len(tokens), V]: transformers' logits before each generated token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    return logits[len(prompt) - 1:len(prompt) - 1 + len(tokens)]


def _warped(logits: torch.Tensor, temperature: float, top_k: int, top_p: float):
    from transformers.generation.logits_process import (TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)
    out = TemperatureLogitsWarper(temperature)(None, logits.clone())
    out = TopKLogitsWarper(top_k)(None, out)
    return TopPLogitsWarper(top_p)(None, out)


def _check(completion, want: torch.Tensor, num: int) -> None:
    """Each position's chosen token's value and its top-num values equal want's rows."""
    assert len(completion.logprobs) == len(completion.token_ids) == TOKENS
    for row, token, entries in zip(want, completion.token_ids, completion.logprobs):
        assert entries[token].logprob == pytest.approx(row[token].item(), rel=1e-4, abs=1e-4)
        top = sorted((e for t, e in entries.items() if e.rank <= num), key=lambda e: e.rank)
        expected = row.topk(num).values.tolist()
        got = [e.logprob for e in top][:num]
        assert got == pytest.approx(expected, rel=1e-4, abs=1e-4)


@pytest.mark.parametrize("mode", ["processed_logprobs", "processed_logits"])
def test_processed_values_are_transformers_warped_logits(tiny, mode):
    path, hf = tiny
    llm = _llm(path, mode)
    params = SamplingParams(temperature=0.7, top_k=6, top_p=0.9, seed=3, max_tokens=TOKENS,
                            logprobs=4, ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0].outputs[0]
    want = _warped(_hf_logits(hf, PROMPT, out.token_ids), 0.7, 6, 0.9)
    if mode == "processed_logprobs":
        want = want.log_softmax(dim=-1)
    _check(out, want, 4)
    kept = sum(1 for e in out.logprobs[0].values() if e.logprob > float("-inf"))
    assert kept <= 6  # what top-k / top-p drop is -inf, reported as such
    llm.shutdown()


def test_raw_logits_and_a_greedy_row_beside_a_random_one(tiny):
    """raw_logits: the model's logits, prompt logprobs too; processed_logprobs: a greedy
    request beside a random one reports its plain logprobs (temperature 1, no filters)."""
    path, hf = tiny
    llm = _llm(path, "raw_logits")
    params = SamplingParams(temperature=0.0, max_tokens=TOKENS, logprobs=3, prompt_logprobs=2,
                            ignore_eos=True)
    out = llm.generate([{"prompt_token_ids": PROMPT}], params, use_tqdm=False)[0]
    _check(out.outputs[0], _hf_logits(hf, PROMPT, out.outputs[0].token_ids), 3)
    with torch.no_grad():
        prompt_logits = hf(torch.tensor([PROMPT])).logits[0].float()
    for pos in range(1, len(PROMPT)):
        got = out.prompt_logprobs[pos][PROMPT[pos]].logprob
        assert got == pytest.approx(prompt_logits[pos - 1, PROMPT[pos]].item(), rel=1e-4, abs=1e-4)
    llm.shutdown()
    llm = _llm(path, "processed_logprobs")
    greedy = SamplingParams(temperature=0.0, max_tokens=TOKENS, logprobs=3, ignore_eos=True)
    sampled = SamplingParams(temperature=0.5, top_k=3, seed=1, max_tokens=TOKENS, logprobs=3,
                             ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": PROMPT}] * 2, [greedy, sampled], use_tqdm=False)
    first = outs[0].outputs[0]
    _check(first, _hf_logits(hf, PROMPT, first.token_ids).log_softmax(dim=-1), 3)
    llm.shutdown()


def test_bad_modes_and_what_cannot_take_them(tiny):
    from loom.beam_search import BeamSearchParams
    path, _ = tiny
    with pytest.raises(ValueError, match="logprobs_mode: 'bogus' is not one of"):
        _llm(path, "bogus")
    with pytest.raises(ValueError, match="logprobs_mode: 'raw_logits' is not supported with "
                                         "speculative decoding"):
        LLM(path, skip_tokenizer_init=True, device="cpu", logprobs_mode="raw_logits",
            speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    llm = _llm(path, "processed_logits")
    with pytest.raises(ValueError, match="beam_width: beam search ranks beams by their "
                                         "logprobs"):
        llm.beam_search([{"prompt_token_ids": PROMPT}], BeamSearchParams(2, 3))
    llm.shutdown()
