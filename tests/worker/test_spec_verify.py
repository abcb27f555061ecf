"""Draft verification (speculative decoding): greedy rows keep the argmax; random rows'
outputs are draws from the sampler's own filtered distribution, whatever the drafts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loom.sampling_params import SamplingParams
from loom.worker.sampler import filtered_probs
from loom.worker.sampling_metadata import SamplingMetadata
from loom.worker.spec_verify import SpecRows, verify

V = 8


def run(logits_per_req: list[torch.Tensor], drafts: list[list[int]],
        params: list[SamplingParams], bonus: list[int]) -> torch.Tensor:
    """verify() over requests each given its draft rows' logits ([k, V])."""
    last_rows = np.cumsum([len(d) + 1 for d in drafts]) - 1
    spec = SpecRows.build(drafts, last_rows)
    arrays = [torch.from_numpy(a) for a in (spec.counts, spec.draft_ids, spec.sample_row,
                                             spec.position)]
    logits = torch.cat([x for x in logits_per_req if len(x)]).float()
    per_draft = [params[r] for r in spec.sample_row]
    assert spec.hidden_rows.tolist() == [last_rows[r] - len(drafts[r]) + p for r, p in
                                         zip(spec.sample_row, spec.position)]
    return verify(logits, spec, arrays, per_draft, torch.tensor(bonus), V)[0]


def target(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    md = SamplingMetadata.build([p], [[]], [[]], [set()], [None], "cpu", V)
    probs = filtered_probs(logits.clone().unsqueeze(0).float(), md)[0]
    return probs / probs.sum()


def test_greedy_accepts_the_argmax_prefix_then_corrects_or_adds_the_bonus():
    g = SamplingParams(temperature=0.0)
    eye = torch.eye(V) * 5
    out = run([eye[[3, 4, 5]], eye[[1]], torch.empty(0, V), eye[[6, 6]]],
              [[3, 4, 0], [2], [], [6, 6]], [g, g, g, g], [7, 7, 7, 5])
    assert out.tolist() == [[3, 4, 5, -1], [1, -1, -1, -1], [7, -1, -1, -1], [6, 6, 5, -1]]


N = 200_000


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=5, top_p=0.9),
    SamplingParams(temperature=1.3, min_p=0.1),
], ids=["t1", "topk-topp", "minp"])
@pytest.mark.parametrize("draft", [0, 3, 7])
def test_random_rows_draw_from_the_target_whatever_the_draft(params, draft):
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 0.5, -1.0, 1.5, 0.0, 1.0, -0.5, -3.0])
    p = target(logits, params)
    out = run([logits.unsqueeze(0)] * N, [[draft]] * N, [params] * N, [-7] * N)
    first = out[:, 0]
    freq = torch.bincount(first, minlength=V).double() / N
    sigma = (p * (1 - p) / N).sqrt().clamp_min(1e-4)
    assert ((freq - p).abs() / sigma).max() < 5, (freq, p)
    accepted = first == draft
    assert (out[accepted, 1] == -7).all() and (out[~accepted, 1] == -1).all()


def test_two_drafts_the_second_judged_by_its_own_row_after_the_first_is_kept():
    torch.manual_seed(1)
    params = SamplingParams(temperature=1.0)
    row1 = torch.tensor([1.0, 1.0, 0.0, 0.0, -1.0, -1.0, -2.0, 0.5])
    row2 = torch.tensor([-2.0, 0.0, 2.0, 0.0, 1.0, -1.0, 0.0, 0.0])
    p1, p2 = target(row1, params), target(row2, params)
    out = run([torch.stack([row1, row2])] * N, [[0, 4]] * N, [params] * N, [9] * N)
    kept = out[:, 0] == 0
    assert abs(kept.double().mean() - p1[0]) < 5 * (p1[0] * (1 - p1[0]) / N).sqrt()
    second = out[kept, 1]
    freq = torch.bincount(second, minlength=V).double() / len(second)
    sigma = (p2 * (1 - p2) / len(second)).sqrt().clamp_min(1e-4)
    assert ((freq - p2).abs() / sigma).max() < 5
    both = kept & (out[:, 1] == 4)
    assert (out[both, 2] == 9).all() and (out[kept & ~both, 2] == -1).all()


def test_greedy_and_random_requests_in_one_step():
    torch.manual_seed(2)
    g, r = SamplingParams(temperature=0.0), SamplingParams(temperature=1.0)
    certain = torch.full((V,), -1e4)
    certain[5] = 0.0  # a random row that must take token 5: its draft 5 is always kept
    eye = torch.eye(V) * 5
    out = run([eye[[2, 3]], certain.repeat(2, 1), eye[[1]]], [[2, 4], [5, 5], [0]],
              [g, r, g], [6, 6, 6])
    assert out.tolist() == [[2, 3, -1], [5, 5, 6], [1, -1, -1]]


def test_seeded_rows_draw_from_the_target_each_from_its_own_generator():
    """Each seeded draft row draws from a generator seeded by (seed, output index): the
    target distribution over seeds, the same tokens whatever else is in the step."""
    torch.manual_seed(3)
    logits = torch.tensor([2.0, 0.5, -1.0, 1.5, 0.0, 1.0, -0.5, -3.0])
    n = 40_000
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(n)]
    drafts = [[3]] * n

    def seeded_run(rows, extra=0):
        last_rows = np.arange(len(rows) + extra) * 2 + 1
        d = drafts[:len(rows)] + [[0]] * extra
        spec = SpecRows.build(d, last_rows)
        arrays = [torch.from_numpy(a) for a in (spec.counts, spec.draft_ids, spec.sample_row,
                                                 spec.position)]
        p = [params[i] for i in rows] + [SamplingParams(temperature=1.0)] * extra
        return verify(logits.repeat(len(p), 1), spec, arrays, p,
                      torch.full((len(p),), -7), V, draws=[5] * len(p))[0]

    out = seeded_run(range(n))
    p = target(logits, params[0])
    freq = torch.bincount(out[:, 0], minlength=V).double() / n
    assert ((freq - p).abs() / (p * (1 - p) / n).sqrt().clamp_min(1e-4)).max() < 5
    # Seeds 0..199 alone, and beside 300 unseeded rows: the same tokens.
    assert torch.equal(seeded_run(range(200)), out[:200])
    assert torch.equal(seeded_run(range(200), extra=300)[:200], out[:200])
