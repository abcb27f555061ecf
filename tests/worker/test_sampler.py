"""Sampler tests; every reference is computed independently here with numpy or plain torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loom.sampling_params import SamplingParams
from loom.worker.sampler import (Sampler, SamplingMetadata, apply_penalties,
                                 compute_prompt_logprobs)

CPU = torch.device("cpu")


def build(params, *, outputs=None, prompts=None, stops=None, seeds=None, vocab_size):
    n = len(params)
    return SamplingMetadata.build(
        params,
        output_token_ids=outputs if outputs is not None else [[] for _ in range(n)],
        prompt_token_ids=prompts if prompts is not None else [[0] for _ in range(n)],
        stop_ids=stops if stops is not None else [set() for _ in range(n)],
        seeds=seeds if seeds is not None else [p.seed for p in params],
        device=CPU,
        vocab_size=vocab_size,
    )


def sample(logits, params, **kw):
    md = build(params, vocab_size=logits.shape[-1], **kw)
    return Sampler()(logits.clone(), md)


def reference_probs(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, slack=0.0):
    """softmax(logits / T), truncated by top-k, then top-p on the renormalised top-k, and
    min-p; `slack` widens top-p and min-p to absorb float rounding at their boundaries."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    keep = np.ones(p.shape, dtype=bool)
    if top_k > 0:
        keep[order[top_k:]] = False
    if top_p < 1.0:
        q = np.where(keep, p, 0.0)[order]
        q /= q.sum()
        before = np.cumsum(q) - q
        keep[order[before >= top_p + slack]] = False
    if min_p > 0.0:
        keep &= p >= min_p * (1 - slack) * p.max()
    r = np.where(keep, p, 0.0)
    return r / r.sum()


def test_greedy_equals_argmax():
    logits = torch.randn(16, 1000, generator=torch.Generator().manual_seed(0))
    out = sample(logits, [SamplingParams(temperature=0.0)] * 16)
    assert torch.equal(out.sampled_token_ids, logits.argmax(-1))
    assert out.logprobs is None


def test_greedy_rows_mixed_with_random():
    torch.manual_seed(0)
    logits = torch.randn(4, 32) * 0.1  # flat enough that random rows vary
    params = [SamplingParams(temperature=t) for t in (0.0, 1.0, 0.0, 1.5)]
    draws = torch.stack([sample(logits, params).sampled_token_ids for _ in range(30)])
    argmax = logits.argmax(-1)
    assert (draws[:, 0] == argmax[0]).all() and (draws[:, 2] == argmax[2]).all()
    assert len(set(draws[:, 1].tolist())) > 5 and len(set(draws[:, 3].tolist())) > 5


def _random_filter_params(rng, use_top_p):
    return SamplingParams(
        temperature=float(rng.choice([0.5, 1.0, 2.0])),
        top_k=int(rng.choice([0, 1, 3, 10])),
        top_p=float(rng.uniform(0.2, 0.95)) if use_top_p and rng.random() < 0.7 else 1.0,
        min_p=float(rng.choice([0.0, 0.05, 0.3])),
    )


@pytest.mark.parametrize("use_top_p", [False, True])
def test_filters_only_sample_allowed_tokens(use_top_p):
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    for _ in range(10):
        logits = torch.randn(32, 50) * 2
        params = [_random_filter_params(rng, use_top_p) for _ in range(32)]
        allowed = [reference_probs(logits[i].numpy(), p.temperature, p.top_k, p.top_p,
                                   p.min_p, slack=1e-4) > 0 for i, p in enumerate(params)]
        for _ in range(20):
            tokens = sample(logits, params).sampled_token_ids.tolist()
            assert all(allowed[i][t] for i, t in enumerate(tokens))


LOGITS_8 = [2.0, 1.5, 1.0, 0.6, 0.3, 0.0, -0.5, -1.0]


@pytest.mark.parametrize("kw", [
    dict(temperature=1.0),
    dict(temperature=0.6),
    dict(temperature=1.0, top_k=3),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=0.8, min_p=0.2),
    dict(temperature=1.3, top_k=5, top_p=0.7, min_p=0.1),
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_sampled_distribution_matches_truncated_reference(kw):
    torch.manual_seed(2)
    n = 8000
    logits = torch.tensor([LOGITS_8] * n)
    tokens = sample(logits, [SamplingParams(**kw)] * n).sampled_token_ids
    observed = np.bincount(tokens.numpy(), minlength=8)
    expected = reference_probs(LOGITS_8, **kw) * n
    assert observed[expected == 0].sum() == 0
    live = expected > 0
    chi2 = (((observed[live] - expected[live]) ** 2) / expected[live]).sum()
    assert chi2 < 30.0, (observed, expected.round(1))  # df <= 7: p(chi2 > 24.3) = 0.001


def test_penalties_equal_hand_computation():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0, -2.0, 1.0]] * 2)
    params = [SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25),
              SamplingParams()]
    md = build(params, outputs=[[3, 3, 2], [3]], prompts=[[1, 4], [1]], vocab_size=6)
    out = apply_penalties(logits.clone(), md)
    # seen {1, 2, 3, 4}; output counts {3: 2, 2: 1}.
    # t1: -1*2 = -2.   t2: 0.5/2 - 0.25*1 - 0.5 = -0.5.   t3: 3/2 - 0.25*2 - 0.5 = 0.5.
    # t4: -2*2 = -4.   t0, t5 unseen, unchanged.  Row 1 has no penalties.
    expected = torch.tensor([[2.0, -2.0, -0.5, 0.5, -4.0, 1.0], [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]])
    assert torch.allclose(out, expected)


def test_penalties_read_token_table_spans_as_they_read_lists():
    """The model runner hands the penalties each request's prompt and outputs as spans of
    its token table (`for_requests`); counted with np.bincount row by row, they equal the
    lists' counts, empty spans and rows in any order of the table included."""
    from loom.worker.input_batch import CachedRequestState
    rng = np.random.default_rng(0)
    V, rows = 50, [3, 0, 5, 1]
    table = rng.integers(0, V, (6, 40)).astype(np.int32)
    lens, prompts = [12, 1, 40, 7], [5, 1, 30, 7]  # the last: no output yet
    reqs = [CachedRequestState(str(i), table[r, :n].tolist(), p,
                               SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5),
                               [], None, row=r)
            for i, (r, n, p) in enumerate(zip(rows, lens, prompts))]
    md = SamplingMetadata.for_requests(reqs, lens, CPU, V, None, None, table)
    for i, (r, n, p) in enumerate(zip(rows, lens, prompts)):
        assert md.output_counts[i].tolist() == np.bincount(table[r, p:n], minlength=V).tolist()
        assert md.prompt_mask[i].tolist() == (np.bincount(table[r, :p], minlength=V) > 0).tolist()
    lists = build([r.params for r in reqs], outputs=[r.output_token_ids for r in reqs],
                  prompts=[r.token_ids[:r.num_prompt_tokens] for r in reqs], vocab_size=V)
    assert torch.equal(lists.output_counts, md.output_counts)
    assert torch.equal(lists.prompt_mask, md.prompt_mask)


def test_penalties_steer_greedy_rows():
    logits = torch.tensor([[2.0, 0.0, 3.0]])
    assert sample(logits, [SamplingParams(temperature=0.0)],
                  outputs=[[2]]).sampled_token_ids.tolist() == [2]
    assert sample(logits, [SamplingParams(temperature=0.0, repetition_penalty=2.0)],
                  outputs=[[2]], prompts=[[1]]).sampled_token_ids.tolist() == [0]
    assert sample(logits, [SamplingParams(temperature=0.0, frequency_penalty=0.6)],
                  outputs=[[2, 2]]).sampled_token_ids.tolist() == [0]


def test_min_tokens_masks_stop_ids():
    torch.manual_seed(3)
    logits = torch.tensor([[0.0, 0.1, 0.2, 0.3, 0.0, 9.0, 0.0, 8.0]] * 2)
    params = [SamplingParams(temperature=0.0, min_tokens=3), SamplingParams(min_tokens=3)]
    stops = [{5, 7}, {5, 7}]
    for _ in range(50):
        tokens = sample(logits, params, outputs=[[1, 1], [1, 1]], stops=stops)
        assert tokens.sampled_token_ids[0] == 3
        assert tokens.sampled_token_ids[1] not in (5, 7)
    done = sample(logits, params, outputs=[[1, 1, 1], [1, 1, 1]], stops=stops)
    assert done.sampled_token_ids[0] == 5


def test_logprobs_are_of_raw_logits_with_rank_and_sorted_top():
    torch.manual_seed(4)
    logits = torch.randn(4, 50)
    params = [SamplingParams(logprobs=3, repetition_penalty=1.8),
              SamplingParams(temperature=0.7, top_k=5),
              SamplingParams(logprobs=0, temperature=0.0, presence_penalty=1.5),
              SamplingParams(logprobs=5, temperature=2.0)]
    out = sample(logits, params, outputs=[[0, 1], [2], [int(logits[2].argmax())], [3]])
    lp = out.logprobs
    exp = np.exp(logits.double().numpy())
    raw = np.log(exp / exp.sum(-1, keepdims=True))
    sampled = out.sampled_token_ids.numpy()
    assert lp.token_ids.shape == (4, 6) and lp.logprobs.shape == (4, 6)
    assert np.array_equal(lp.token_ids[:, 0].numpy(), sampled)
    assert np.allclose(lp.logprobs[:, 0].numpy(), raw[np.arange(4), sampled], atol=1e-5)
    assert np.array_equal(lp.token_ids[:, 1:].numpy(), np.argsort(-raw, axis=-1)[:, :5])
    assert np.allclose(lp.logprobs[:, 1:].numpy(), -np.sort(-raw, axis=-1)[:, :5], atol=1e-5)
    expected_ranks = (raw > raw[np.arange(4), sampled][:, None]).sum(-1) + 1
    assert np.array_equal(lp.ranks.numpy(), expected_ranks)


def test_logprobs_to_structs_slices_per_row():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]] * 3)
    params = [SamplingParams(temperature=0.0, logprobs=n) for n in (2, 0, 0)]
    structs = sample(logits, params).logprobs.to_structs([2, None, 0])
    assert structs[1] is None
    assert structs[0].token_ids == [0, 0, 1] and structs[0].rank == 1
    assert structs[2].token_ids == [0] and len(structs[2].logprobs) == 1
    assert structs[0].logprobs[0] == pytest.approx(torch.log_softmax(logits[0], -1)[0].item())


def test_prompt_logprobs():
    logits = torch.randn(5, 20, generator=torch.Generator().manual_seed(5))
    next_ids = torch.tensor([3, 0, 19, 7, 7])
    lp = compute_prompt_logprobs(logits, next_ids, num_top=2)
    ref = torch.log_softmax(logits.double(), -1)
    assert torch.allclose(lp.logprobs[:, 0].double(), ref[torch.arange(5), next_ids], atol=1e-5)
    assert torch.equal(lp.token_ids[:, 1:], ref.argsort(-1, descending=True)[:, :2])
    ranks = (ref > ref[torch.arange(5), next_ids][:, None]).sum(-1) + 1
    assert torch.equal(lp.ranks, ranks)


FLAT = torch.randn(64, generator=torch.Generator().manual_seed(6)) * 0.5


def _seeded_token(seed, num_outputs, position=None):
    """The token of a seeded row alone (position None) or at `position` in a mixed batch."""
    target = SamplingParams(seed=seed, top_k=40)
    if position is None:
        return sample(FLAT[None], [target], outputs=[[1] * num_outputs]).sampled_token_ids.item()
    others = [SamplingParams(), SamplingParams(seed=seed + 1), SamplingParams(temperature=0.0),
              SamplingParams(top_p=0.5), SamplingParams(seed=7, min_p=0.1),
              SamplingParams(presence_penalty=1.0), SamplingParams(seed=seed)]
    params = others[:position] + [target] + others[position:]
    logits = torch.randn(8, 64)
    logits[position] = FLAT
    outputs = [[2] * (i + 3) for i in range(8)]
    outputs[position] = [1] * num_outputs
    return sample(logits, params, outputs=outputs).sampled_token_ids[position].item()


def test_seeded_row_is_independent_of_batch():
    torch.manual_seed(7)
    alone = [_seeded_token(seed, 5) for seed in range(12)]
    assert len(set(alone)) > 3  # the seed really drives the draw
    for position in (0, 3, 7):
        assert [_seeded_token(seed, 5, position) for seed in range(12)] == alone


def test_seed_stream_depends_on_num_outputs():
    stream = [_seeded_token(42, k) for k in range(16)]
    assert len(set(stream)) > 3
    assert [_seeded_token(42, k) for k in range(16)] == stream  # e.g. recomputed after preemption


def test_seeds_apart_by_2_to_the_32_draw_apart():
    """Every seed SamplingParams takes (64 bits, signed) is its own stream of draws, though
    the CPU generator reads 32 bits of its seed."""
    for a, b in ((-1, 2**63 - 1), (1, -(2**63) + 1), (5, 5 + 2**32), (7, 7 + 2**40)):
        assert [_seeded_token(a, k) for k in range(12)] != [_seeded_token(b, k) for k in range(12)]


def test_unseeded_rows_stay_random_beside_seeded_ones():
    logits = torch.stack([FLAT, FLAT])
    params = [SamplingParams(seed=3), SamplingParams()]
    draws = torch.stack([sample(logits, params).sampled_token_ids for _ in range(30)])
    assert len(set(draws[:, 0].tolist())) == 1
    assert len(set(draws[:, 1].tolist())) > 5


def test_metadata_skips_unused_work():
    md = build([SamplingParams()] * 3, vocab_size=10)
    assert md.all_random and not md.all_greedy and md.greedy_mask is None
    assert md.no_penalties and md.no_top_k and md.no_top_p and md.no_min_p
    assert md.max_num_logprobs is None and md.stop_rows is None
    assert md.generators == {} and md.needs_global_rng

    params = [SamplingParams(temperature=0.0, top_k=3, top_p=0.5, seed=1),
              SamplingParams(top_k=4, logprobs=2, seed=9, min_tokens=2),
              SamplingParams(top_k=50, logprobs=0, frequency_penalty=0.1)]
    md = build(params, stops=[{1}, {2, 3}, {4}], vocab_size=10)
    assert not md.all_random and not md.all_greedy
    assert md.greedy_mask.tolist() == [True, False, False]
    assert md.top_k.tolist() == [10, 4, 10] and md.max_top_k == 4
    assert md.no_top_p and md.no_min_p and not md.no_penalties
    assert md.repetition_penalty is None and md.presence_penalty is None
    assert md.max_num_logprobs == 2
    assert list(md.generators) == [1] and md.needs_global_rng  # row 2 has no seed
    assert not build(params[1:2], vocab_size=10).needs_global_rng
    assert md.stop_rows.tolist() == [1, 1] and md.stop_cols.tolist() == [2, 3]


def test_vanishing_top_p_and_repetition_penalty_keep_their_meaning():
    """Positive values below float32's range would round to 0: top_p 0 masked every token
    (token 0 came out), and a repetition penalty of 0 made 0 / 0 = NaN of a seen token whose
    logit is 0 (argmax takes NaN: token 0 again). The tiniest top_p keeps only the most
    likely token; a penalty below 1 favours seen tokens, the tiniest the most."""
    logits = torch.tensor([[0.0, 1.0, 5.0, 2.0]] * 3)
    tiny_p = SamplingParams(temperature=1.0, top_p=1e-300, seed=0)
    assert sample(logits, [tiny_p] * 3).sampled_token_ids.tolist() == [2, 2, 2]
    # Seen: token 0 (logit 0) in the prompt, tokens 1 and 3 in the output. Divided by the
    # tiniest penalty, 1 and 3 overflow float32; a random draw still picks one of them.
    tiny_rep = SamplingParams(temperature=1.0, repetition_penalty=1e-300, seed=0)
    out = sample(logits, [tiny_rep] * 3, outputs=[[1, 3]] * 3, prompts=[[0]] * 3)
    assert set(out.sampled_token_ids.tolist()) <= {1, 3}
