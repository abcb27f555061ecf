"""Request options that shape the distribution or the prompt: logit_bias and
allowed_token_ids (OpenAI's and vLLM's), greedy, against transformers' own sequence_bias and
prefix_allowed_tokens_fn on the same tiny model (seeded sampling stays inside the allowed
set); vLLM's truncate_prompt_tokens, against the truncated prompt given whole; bad words against
transformers' bad_words_ids."""

from __future__ import annotations

import pytest
import torch

from loom import LLM, PoolingParams, SamplingParams

PROMPT = "The quick brown fox"
N = 8


@pytest.fixture(scope="module")
def text_llm(tiny_llama_with_tokenizer):
    path, _ = tiny_llama_with_tokenizer
    return LLM(path, dtype="float32", device="cpu", max_model_len=256, seed=0)


def _hf(model, ids: list[int], **kw) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=N, min_new_tokens=N,
                             do_sample=False, eos_token_id=None, pad_token_id=0, **kw)
    return out[0, len(ids):].tolist()


def _loom(llm, ids: list[int], **kw) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True, **kw)
    return llm.generate([ids], params, use_tqdm=False)[0].outputs[0].token_ids


def test_logit_bias_equals_transformers_sequence_bias(text_llm, tiny_llama_with_tokenizer):
    model = tiny_llama_with_tokenizer[1]
    ids = text_llm.get_tokenizer().encode(PROMPT)
    plain = _hf(model, ids)
    # Ban what it would say first, push a few arbitrary tokens up.
    bias = {plain[0]: -100.0, 1000: 8.0, 2024: 6.5, 77: -3.0}
    expected = _hf(model, ids, sequence_bias={(t,): b for t, b in bias.items()})
    assert expected != plain
    assert _loom(text_llm, ids, logit_bias=bias) == expected


def test_allowed_token_ids_equal_transformers_prefix_allowed(text_llm,
                                                             tiny_llama_with_tokenizer):
    model = tiny_llama_with_tokenizer[1]
    ids = text_llm.get_tokenizer().encode(PROMPT)
    allowed = [5, 300, 4096, 9000, 12345]
    expected = _hf(model, ids, prefix_allowed_tokens_fn=lambda batch, prefix: allowed)
    assert _loom(text_llm, ids, allowed_token_ids=allowed) == expected
    sampled = text_llm.generate([ids] * 3, SamplingParams(
        temperature=1.5, seed=7, max_tokens=N, ignore_eos=True, allowed_token_ids=allowed),
        use_tqdm=False)
    assert all(set(o.outputs[0].token_ids) <= set(allowed) for o in sampled)


@pytest.mark.parametrize("kwargs, field", [
    (dict(logit_bias={5: 101.0}), "logit_bias"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(allowed_token_ids=[]), "allowed_token_ids"),
    (dict(allowed_token_ids=[1.5]), "allowed_token_ids"),
])
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**kwargs)


def test_ids_beyond_the_vocabulary_name_the_field(text_llm):
    for field, value in (("logit_bias", {10**6: 1.0}), ("allowed_token_ids", [10**6])):
        with pytest.raises(ValueError, match=f"^{field}: token id"):
            text_llm.generate(["x"], SamplingParams(**{field: value}), use_tqdm=False)
    assert text_llm.generate(["x"], SamplingParams(max_tokens=2), use_tqdm=False)


def test_truncate_prompt_tokens_keeps_the_last_tokens(text_llm):
    ids = text_llm.get_tokenizer().encode("one two three four five six seven eight nine ten")
    cut = text_llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True,
                                                  truncate_prompt_tokens=4), use_tqdm=False)[0]
    assert cut.prompt_token_ids == ids[-4:]
    assert cut.outputs[0].token_ids == _loom(text_llm, ids[-4:])
    whole = text_llm.generate([ids], SamplingParams(max_tokens=1, truncate_prompt_tokens=-1),
                              use_tqdm=False)[0]
    assert whole.prompt_token_ids == ids  # -1: up to max_model_len, which it fits
    embedded = text_llm.embed([ids], PoolingParams(truncate_prompt_tokens=3), use_tqdm=False)[0]
    assert embedded.prompt_token_ids == ids[-3:]
    assert embedded.outputs.embedding == pytest.approx(
        text_llm.embed([ids[-3:]], use_tqdm=False)[0].outputs.embedding, abs=1e-6)
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="^truncate_prompt_tokens:"):
            SamplingParams(truncate_prompt_tokens=bad)
        with pytest.raises(ValueError, match="^truncate_prompt_tokens:"):
            PoolingParams(truncate_prompt_tokens=bad)


def test_truncate_prompt_tokens_cuts_a_text_as_its_tokenizer_does(text_llm,
                                                                   tiny_llama_with_tokenizer):
    """A text prompt is cut as transformers' own left truncation cuts it (vLLM tokenizes
    with truncation=True, max_length=k): <|begin_of_text|> kept, then the last k - 1
    tokens; token ids are cut plainly (the test above)."""
    import transformers as tf
    text = "one two three four five six seven eight nine ten"
    tok = tf.AutoTokenizer.from_pretrained(tiny_llama_with_tokenizer[0], truncation_side="left")
    want = tok(text, truncation=True, max_length=4).input_ids
    assert len(want) == 4 and want[0] == tok.bos_token_id
    cut = text_llm.generate([text], SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True,
                                                   truncate_prompt_tokens=4), use_tqdm=False)[0]
    assert cut.prompt_token_ids == want
    assert cut.outputs[0].token_ids == _loom(text_llm, want)
    embedded = text_llm.embed([text], PoolingParams(truncate_prompt_tokens=4),
                              use_tqdm=False)[0]
    assert embedded.prompt_token_ids == want


def test_bad_words_equal_transformers_bad_words_ids(text_llm, tiny_llama_with_tokenizer):
    model = tiny_llama_with_tokenizer[1]
    ids = text_llm.get_tokenizer().encode(PROMPT)
    first = _hf(model, ids)[0]
    # A second, two-token bad word taken from what it says once the first is banned, so
    # that the rule on the preceding token fires mid-output.
    h = _hf(model, ids, bad_words_ids=[[first]])
    assert ids[-1] != h[2]  # transformers also matches against the prompt; loom, as vLLM, not
    bad = [[first], [h[2], h[3]]]
    expected = _hf(model, ids, bad_words_ids=bad)
    assert expected[:3] == h[:3] and expected[3] != h[3]
    assert _loom(text_llm, ids, bad_words_token_ids=bad) == expected


def test_bad_words_are_tokenized_alone_and_after_a_space(text_llm, tiny_llama_with_tokenizer):
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(tiny_llama_with_tokenizer[0])
    alone, spaced = (hf.encode(w, add_special_tokens=False) for w in ("fox", " fox"))
    params = text_llm.processor.process("bad-words", [1, 2, 3], SamplingParams(
        bad_words=["fox"])).sampling_params
    assert params.bad_words_token_ids == [alone, spaced] and params.bad_words == []
    ids = text_llm.get_tokenizer().encode(PROMPT)
    plain = _loom(text_llm, ids)
    word = text_llm.get_tokenizer().decode(plain[:1]).strip()
    banned = {t for w in (word, " " + word) for t in hf.encode(w, add_special_tokens=False)}
    out = _loom(text_llm, ids, bad_words=[word])
    assert out[0] != plain[0] and not banned & set(out)


def test_beam_search_equals_transformers(text_llm, tiny_llama_with_tokenizer):
    """LLM.beam_search (vLLM's algorithm) against transformers' num_beams on the same model:
    without an end token both keep the beam_width best cumulative logprobs each step."""
    from loom import BeamSearchParams
    model = tiny_llama_with_tokenizer[1]
    prompts = [text_llm.get_tokenizer().encode(p) for p in (PROMPT, "In a galaxy far away")]
    outs = text_llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                                BeamSearchParams(beam_width=3, max_tokens=6, ignore_eos=True))
    for ids, out in zip(prompts, outs):
        with torch.no_grad():
            hf = model.generate(torch.tensor([ids]), num_beams=3, num_return_sequences=3,
                                max_new_tokens=6, min_new_tokens=6, do_sample=False,
                                eos_token_id=None, pad_token_id=0, early_stopping=False)
        expected = [row[len(ids):].tolist() for row in hf]
        assert [s.tokens[len(ids):] for s in out.sequences] == expected
        assert [s.finish_reason for s in out.sequences] == ["length"] * 3
        assert out.sequences[0].text == text_llm.get_tokenizer().decode(expected[0])
        scores = [s.cum_logprob for s in out.sequences]
        assert scores == sorted(scores, reverse=True)
    with pytest.raises(ValueError, match="^beam_width:"):
        BeamSearchParams(beam_width=0, max_tokens=4)
    with pytest.raises(ValueError, match="^beam_width: a beam width of 11 asks for 22 logprobs"):
        text_llm.beam_search(["x"], BeamSearchParams(beam_width=11, max_tokens=2))
    with pytest.raises(ValueError, match="^params: expected BeamSearchParams, got dict"):
        text_llm.beam_search(["x"], {"beam_width": 2, "max_tokens": 2})


def test_cache_salt_in_prompt_dicts(text_llm):
    """vLLM's prompt dicts carry cache_salt: prefixes are shared only under the same salt."""
    ids = [(7 * i) % 5000 + 11 for i in range(40)]  # two full 16-token blocks, and more
    params = SamplingParams(max_tokens=1)

    def cached(**salt) -> int:
        return text_llm.generate([{"prompt_token_ids": ids, **salt}], params,
                                 use_tqdm=False)[0].num_cached_tokens
    assert cached(cache_salt="a") == 0
    assert cached(cache_salt="b") == 0 and cached() == 0
    assert cached(cache_salt="a") == 32 and cached() == 32
    with pytest.raises(ValueError, match="^cache_salt:"):
        cached(cache_salt="")
