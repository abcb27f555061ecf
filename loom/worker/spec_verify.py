"""Verifying speculative decoding's draft tokens against the model (the worker's side).

A drafting request's step computes its last token and its k drafts; row j of those logits
is the model's distribution for the token after draft j - 1. Draft j is accepted while
every draft before it was:
  greedy rows: when it is the argmax;
  random rows: with probability p(draft) under the row's filtered distribution (temperature,
  top-k, top-p, min-p); at the first rejection the token is drawn from p with the draft
  removed and renormalised. The draft is a point mass, so this is the rejection sampling of
  speculative decoding (Leviathan et al., Chen et al.) and each output token is a draw
  from p, exactly as without drafts.
The accepted drafts are followed by one more token: the one drawn at the first rejection,
or, when all were accepted, the token sampled at the last position as usual (the bonus).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from loom.sampling_params import SamplingParams
from loom.worker.sampler import exponential_race, filtered_probs, gather_logprobs, greedy_argmax
from loom.worker.sampling_metadata import SamplingMetadata, derive_seed


@dataclass
class SpecRows:
    """A step's draft positions, flat over its drafting requests (host arrays, uploaded
    with the step's inputs)."""
    counts: np.ndarray
    """[R] drafts of each sampling request (0 for those without)."""
    hidden_rows: np.ndarray
    """[N] token rows whose logits judge each draft (the row before it)."""
    draft_ids: np.ndarray
    """[N] the drafts."""
    sample_row: np.ndarray
    """[N] the sampling request each draft belongs to (index into the sampling requests)."""
    position: np.ndarray
    """[N] the draft's place in its request's draft."""

    @classmethod
    def build(cls, drafts: list[list[int]], last_rows: np.ndarray) -> SpecRows | None:
        """drafts: per sampling request; last_rows: each one's last token row. None when
        no request drafts."""
        counts = np.asarray([len(d) for d in drafts], dtype=np.int64)
        if not counts.any():
            return None
        sample_row = np.repeat(np.arange(len(drafts)), counts)
        starts = np.concatenate([[0], np.cumsum(counts)])
        position = np.arange(starts[-1]) - starts[sample_row]
        hidden_rows = last_rows[sample_row] - counts[sample_row] + position
        return cls(counts, hidden_rows, np.concatenate(drafts).astype(np.int64), sample_row,
                   position)


def verify(logits: torch.Tensor, spec: SpecRows, device_arrays: list[torch.Tensor],
           params: list[SamplingParams], bonus: torch.Tensor, vocab_size: int,
           draws: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, K + 1] tokens per sampling request: its accepted drafts, then one more token;
    -1 past them. Also, per draft row, the token that row chose (the draft where kept, else
    the one drawn in its place). logits: [N, V] float32 at spec.hidden_rows (scratch);
    device_arrays: counts, draft ids, sample rows and positions on the device; params: per
    draft; bonus: [R] the tokens sampled at each request's last row; draws: per draft, the
    index of the output token it stands for (a seeded row draws from its own generator,
    seeded by that index, so that its tokens do not depend on the batch)."""
    counts, draft_ids, sample_row, position = device_arrays
    accepted, recovered = _judge(logits, draft_ids, params, vocab_size, draws)
    num_reqs, k = len(spec.counts), int(spec.counts.max())
    table = torch.zeros((3, num_reqs, k), dtype=torch.long, device=logits.device)
    table[:, sample_row, position] = torch.stack([accepted.long(), recovered, draft_ids])
    num_accepted = table[0].cumprod(dim=1).sum(dim=1)
    last = torch.where(num_accepted < counts,
                       table[1].gather(1, num_accepted.clamp(max=k - 1).unsqueeze(1)).squeeze(1),
                       bonus)
    cols = torch.arange(k + 1, device=logits.device)
    out = torch.where(cols[:k] < num_accepted.unsqueeze(1), table[2], -1)
    out = torch.cat([out, out.new_full((num_reqs, 1), -1)], dim=1)
    chosen = torch.where(position < num_accepted[sample_row], draft_ids, recovered)
    return out.scatter_(1, num_accepted.unsqueeze(1), last.unsqueeze(1)), chosen


def _judge(logits: torch.Tensor, draft_ids: torch.Tensor, params: list[SamplingParams],
           vocab_size: int, draws: list[int] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per draft: whether it is accepted, and the token drawn in its place if not."""
    greedy = [p.greedy for p in params]
    if all(greedy):
        choice = greedy_argmax(logits)
        return choice == draft_ids, choice
    accepted = torch.empty_like(draft_ids, dtype=torch.bool)
    recovered = torch.empty_like(draft_ids)
    rand = [i for i, g in enumerate(greedy) if not g]
    rows = torch.as_tensor(rand, device=logits.device)
    if len(rand) < len(params):
        det = torch.as_tensor([i for i, g in enumerate(greedy) if g], device=logits.device)
        choice = greedy_argmax(logits[det])
        accepted[det], recovered[det] = choice == draft_ids[det], choice
    chosen = [params[i] for i in rand]
    md = SamplingMetadata.build(chosen, [[]] * len(rand), [[]] * len(rand), [set()] * len(rand),
                                [None] * len(rand), logits.device, vocab_size)
    md.generators = {k: _generator(chosen[k].seed, draws[i], logits.device)
                     for k, i in enumerate(rand) if chosen[k].seed is not None}
    md.needs_global_rng = len(md.generators) < len(rand)
    probs = filtered_probs(logits[rows], md)
    probs /= probs.sum(dim=-1, keepdim=True)
    drafts = draft_ids[rows].unsqueeze(1)
    p_draft = probs.gather(1, drafts).squeeze(1)
    u = torch.rand_like(p_draft)
    for k, generator in md.generators.items():  # then its exponential race, below
        u[k] = torch.rand((), generator=generator, device=u.device)
    accepted[rows] = u < p_draft
    recovered[rows] = exponential_race(probs.scatter_(1, drafts, 0.0), md)
    return accepted, recovered


def _generator(seed: int, index: int, device: torch.device) -> torch.Generator:
    generator = torch.Generator(device=device)
    generator.manual_seed(derive_seed(seed, index))
    return generator


def verify_step(reqs: list, batch, logits: torch.Tensor, bonus: torch.Tensor,
                vocab_size: int) -> tuple[torch.Tensor, Callable[[], list] | None]:
    """The model runner's verification of a step's drafts (`verify`), on the driver rank
    (which samples); logits: the drafts' rows. Also, where a drafting request asked for
    logprobs, a function making each draft row's logprobs structs once read back (raw
    logprobs of the token the row chose, as the sampler reports them)."""
    spec = batch.spec
    drafting = [reqs[batch.sample_rows[r]] for r in spec.sample_row]
    params = [r.params for r in drafting]
    # Draft j stands for output number computed + 1 + j - prompt (tokens in flight counted).
    draws = [r.num_computed_tokens + 1 + j - r.num_prompt_tokens
             for r, j in zip(drafting, spec.position.tolist())]
    num_top = [p.logprobs for p in params]
    asked = [n for n in num_top if n is not None]
    raw = logits.log_softmax(dim=-1) if asked else None  # before judging rewrites logits
    out, chosen = verify(logits, spec, batch.spec_arrays, params, bonus, vocab_size, draws)
    if raw is None:
        return out, None
    tensors = gather_logprobs(raw, chosen, max(asked))
    return out, lambda: tensors.to_structs(num_top)


def logprob_lists(per_draft: list, counts: np.ndarray, sample_rows: list[int],
                  sampled: list[list[int]], logprobs: list) -> dict[int, list]:
    """Request index -> the logprobs of each token a drafting request output: its draft
    rows' up to the first rejection (that row's drawn token included), then, when every
    draft was kept, the last row's (the sampler's, in `logprobs`)."""
    out, start = {}, 0
    for i, k in zip(sample_rows, counts.tolist()):
        if k and per_draft[start] is not None:
            kept = len(sampled[i]) - 1
            out[i] = per_draft[start:start + min(kept + 1, k)] + (
                [logprobs[i]] if kept == k else [])
        start += k
    return out
