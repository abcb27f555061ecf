"""Speculative decoding (n-gram prompt lookup): greedy outputs equal transformers' with
drafts accepted along the way; outputs end where they would without drafts (max_tokens,
stop tokens, max_model_len); requests that cannot be verified decode as before beside
drafting ones."""

from __future__ import annotations

import random

import pytest

from loom import LLM, SamplingParams
from tests.conftest import hf_greedy

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (5, 17, 33, 48)]
    # Repeating prompts: the tiny models' greedy outputs fall into loops after these, which
    # is where n-gram drafts are accepted.
    return prompts + [[5, 6, 7, 8] * 6, [9, 10, 11] * 10, [40, 41] * 9]


def _llm(path: str, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 256)
    kwargs.setdefault("speculative_config", SPEC)
    return LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", **kwargs)


def _greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


@pytest.mark.parametrize("engine_kwargs", [
    {}, dict(async_scheduling=False), dict(max_num_batched_tokens=16),
    # blocks run out mid-decode: drafts fall back to one token, requests are preempted
    dict(kv_cache_memory_bytes=2 * 2 * 16 * 2 * 16 * 4 * 14, max_model_len=160,
         kv_headroom_tokens=0),
], ids=["default", "sync", "small-budget", "preemption"])
@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_greedy_equals_transformers_with_drafts_accepted(kind, engine_kwargs, tiny_model_factory,
                                                        verified, monkeypatch):
    from loom.core.scheduler import Scheduler
    preempted, preempt = [], Scheduler._preempt
    monkeypatch.setattr(Scheduler, "_preempt",
                        lambda self, req: (preempted.append(req.request_id), preempt(self, req)))
    path, hf = tiny_model_factory(kind)
    prompts = _prompts()
    outs = _llm(path, **engine_kwargs).generate(prompts, _greedy(40), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 40)
    steps, drafted, accepted = verified
    assert steps > 0 and 0 < accepted < drafted
    assert bool(preempted) == ("kv_cache_memory_bytes" in engine_kwargs)


def test_outputs_end_where_they_would_without_drafts(tiny_model_factory, verified):
    path, hf = tiny_model_factory("llama")
    prompts = _prompts()[4:]
    refs = [hf_greedy(hf, p, 40) for p in prompts]
    llm = _llm(path)
    for n in (1, 2, 3, 7):
        outs = llm.generate(prompts, _greedy(n), use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == [r[:n] for r in refs]
        assert {o.outputs[0].finish_reason for o in outs} == {"length"}
    # A stop token late in each output, where drafts are being accepted.
    for prompt, ref in zip(prompts, refs):
        stop = ref[30]
        end = ref.index(stop) + 1
        out = llm.generate([prompt], _greedy(40, stop_token_ids=[stop]), use_tqdm=False)[0]
        assert out.outputs[0].token_ids == ref[:end]
        assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == stop
    # max_model_len ends a request mid-draft as it would any other.
    llm = _llm(path, max_model_len=60)
    prompt = prompts[0]
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=None,
                                                ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].token_ids == refs[0][:60 - len(prompt)]
    assert verified[2] > 0


def test_logprobs_of_drafted_tokens_equal_transformers(tiny_model_factory, verified):
    """Each output token's logprob and top-5, whether it was a kept draft, the token drawn
    at a rejection or the bonus, are those of transformers' forward over the whole text."""
    import torch
    path, hf = tiny_model_factory("llama")
    prompts = _prompts()[4:]
    outs = _llm(path).generate(prompts, _greedy(30, logprobs=5), use_tqdm=False)
    assert verified[2] > 0
    for prompt, out in zip(prompts, outs):
        tokens, logprobs = out.outputs[0].token_ids, out.outputs[0].logprobs
        assert tokens == hf_greedy(hf, prompt, 30) and len(logprobs) == 30
        with torch.no_grad():
            ref = hf(torch.tensor([prompt + tokens])).logits[0].float().log_softmax(-1)
        for j, (token, position) in enumerate(zip(tokens, logprobs)):
            row = ref[len(prompt) + j - 1]
            assert position[token].logprob == pytest.approx(row[token].item(), abs=1e-4)
            assert set(position) == {token, *row.topk(5).indices.tolist()}


def test_requests_that_cannot_be_verified_decode_as_before(tiny_model_factory, verified):
    """Penalties, logit maps and bad words take no drafts: batched with drafting requests
    they give what they give without speculative decoding (and drafting requests with
    logprobs give the same tokens and top tokens)."""
    path, hf = tiny_model_factory("llama")
    prompts = _prompts()[4:]
    others = [_greedy(30, repetition_penalty=1.3), _greedy(30, logit_bias={12: 3.0}),
              _greedy(30, bad_words_token_ids=[[10, 11]]), _greedy(30, logprobs=3)]
    plain = _greedy(30)
    batch = [(p, params) for p in prompts for params in [plain, *others]]
    with_spec = _llm(path).generate([p for p, _ in batch], [s for _, s in batch],
                                    use_tqdm=False)
    assert verified[0] > 0
    without = _llm(path, speculative_config=None).generate(
        [p for p, _ in batch], [s for _, s in batch], use_tqdm=False)
    for (prompt, params), a, b in zip(batch, with_spec, without):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        if params is plain:
            assert a.outputs[0].token_ids == hf_greedy(hf, prompt, 30)
        if params.logprobs:
            assert [lp.keys() for lp in a.outputs[0].logprobs] == \
                [lp.keys() for lp in b.outputs[0].logprobs]


def test_seeded_requests_draft_and_do_not_depend_on_the_batch(tiny_model_factory, verified,
                                                              monkeypatch):
    """A seeded request's tokens, drafted or not, come from generators seeded by their
    output index: the same alone, beside other requests, in another engine, and under sync
    scheduling. It never runs ahead: drafts made then would guess at the tokens in flight,
    and which tokens rejection sampling keeps depends on the drafts."""
    from loom.core.scheduler import Scheduler
    ran_ahead, may = [], Scheduler._may_run_ahead
    monkeypatch.setattr(Scheduler, "_may_run_ahead", lambda self, r: (
        ran_ahead.append(r.sampling_params.seed) if may(self, r) else None) is None and
        may(self, r))
    path, _ = tiny_model_factory("llama")
    prompts = _prompts()[4:]
    seeded = [SamplingParams(temperature=0.5, seed=s, max_tokens=30, ignore_eos=True)
              for s in (1, 2, 3)]
    alone = [o.outputs[0].token_ids for o in _llm(path).generate(prompts, seeded,
                                                                  use_tqdm=False)]
    assert verified[2] > 0
    noise = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    mixed = _llm(path).generate(prompts + prompts, seeded + [noise] * 3, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:3]] == alone
    assert len({tuple(t) for t in alone}) == 3
    assert not {1, 2, 3} & set(ran_ahead)
    sync = _llm(path, async_scheduling=False).generate(prompts, seeded, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in sync] == alone


def test_random_sampling_with_drafts_runs_to_length(tiny_model_factory, verified):
    path, _ = tiny_model_factory("llama")
    params = SamplingParams(temperature=0.3, top_p=0.9, max_tokens=40, ignore_eos=True, n=3)
    outs = _llm(path).generate(_prompts()[4:], params, use_tqdm=False)
    assert all(len(c.token_ids) == 40 for o in outs for c in o.outputs)
    assert all(0 <= t < 256 for o in outs for c in o.outputs for t in c.token_ids)
    assert verified[2] > 0


def test_tensor_parallel_ranks_follow_the_verified_tokens(tiny_model_factory, verified):
    """TP=2 on gloo: the driver verifies, the other rank receives the [R, K + 1] tokens and
    appends the same accepted drafts (else its next inputs and KV would differ)."""
    path, hf = tiny_model_factory("llama")
    prompts = _prompts()[3:]
    llm = _llm(path, tensor_parallel_size=2)
    try:
        outs = llm.generate(prompts, _greedy(40), use_tqdm=False)
    finally:
        llm.shutdown()
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 40)
    assert verified[2] > 0
