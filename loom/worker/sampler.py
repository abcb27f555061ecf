"""The sampler: penalties, min-tokens masking, greedy or filtered random choice, logprobs.

Order of one step:
  1. logprobs of the raw model distribution (vLLM's default), before anything below (or
     the raw logits; under a processed logprobs_mode, the values after step 3's filters);
  2. guided decoding: tokens the row's grammar forbids go to -inf; allowed_token_ids and
     logit_bias; custom logits processors that may change the argmax; repetition /
     presence / frequency penalties, then min_tokens masking of stop ids;
  3. greedy rows: argmax of the penalized logits;
     random rows: temperature, argmax-invariant custom processors, top-k, top-p, min-p,
     then an exponential-race draw.
     On CUDA, a batch with no top-k/top-p/min-p and no seeded row takes loom's kernel
     instead (`loom/kernels/sampling.py`): the same draw as a Gumbel-max argmax.

The logits passed in are scratch: the sampler modifies them in place to avoid [B, V] copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from loom import envs
from loom.engine.protocol import Logprobs
from loom.worker.sampling_metadata import SamplingMetadata

__all__ = ["LogprobsTensors", "Sampler", "SamplerOutput", "SamplingMetadata",
           "apply_penalties", "compute_prompt_logprobs", "filtered_probs", "greedy_argmax"]


@dataclass
class LogprobsTensors:
    token_ids: torch.Tensor
    """[B, 1+N] int64: the chosen token, then the top-N tokens by logprob."""
    logprobs: torch.Tensor
    """[B, 1+N] float32, matching `token_ids`."""
    ranks: torch.Tensor
    """[B] int64 rank of the chosen token (1 = most likely; ties share the better rank)."""

    def to_structs(self, num_per_row: list[int | None]) -> list[Logprobs | None]:
        """Wire structs; row i keeps its own top-`num_per_row[i]`, None where not asked."""
        # One host transfer per tensor for the whole batch, then plain Python slicing.
        token_ids, logprobs = self.token_ids.tolist(), self.logprobs.tolist()
        ranks = self.ranks.tolist()
        return [None if n is None else Logprobs(token_ids[i][:1 + n], logprobs[i][:1 + n], ranks[i])
                for i, n in enumerate(num_per_row)]


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor
    """[B] int64."""
    logprobs: LogprobsTensors | None


class Sampler(nn.Module):
    def __init__(self, logprobs_mode: str = "raw_logprobs") -> None:
        super().__init__()
        self.logprobs_mode = logprobs_mode
        """ModelConfig.logprobs_mode: what the reported logprobs hold."""
        self._raw = logprobs_mode.startswith("raw")

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        logits = logits.float()
        wanted = metadata.max_num_logprobs is not None
        mode = self.logprobs_mode
        reported = None
        if wanted and self._raw:
            reported = logits.log_softmax(dim=-1) if mode == "raw_logprobs" else logits.clone()
        logits = apply_grammar(logits, metadata)
        logits = apply_token_maps(logits, metadata)
        if metadata.custom is not None:
            logits = metadata.custom.apply(logits, argmax_invariant=False)
        logits = apply_penalties(logits, metadata)
        logits = apply_min_tokens(logits, metadata)
        if wanted and not self._raw:
            sampled, processed = _sample_processed(logits, metadata)
            reported = processed.log_softmax(dim=-1) if mode == "processed_logprobs" else processed
        else:
            sampled = _sample(logits, metadata)
        if reported is None:
            return SamplerOutput(sampled, None)
        return SamplerOutput(sampled, gather_logprobs(reported, sampled,
                                                      metadata.max_num_logprobs))


def compute_prompt_logprobs(
    logits: torch.Tensor, next_token_ids: torch.Tensor, num_top: int, mode: str = "raw_logprobs"
) -> LogprobsTensors:
    """Logprobs of each prompt position's next token ([T, V] logits, [T] token ids): raw,
    a prompt having no sampling (logits under either logits mode)."""
    logits = logits.float()
    values = logits if mode.endswith("logits") else logits.log_softmax(dim=-1)
    return gather_logprobs(values, next_token_ids, num_top)


def gather_logprobs(
    logprobs: torch.Tensor, token_ids: torch.Tensor, num_top: int
) -> LogprobsTensors:
    chosen = logprobs.gather(-1, token_ids.unsqueeze(-1))
    top_logprobs, top_ids = logprobs.topk(num_top, dim=-1)
    ranks = (logprobs > chosen).sum(dim=-1) + 1
    return LogprobsTensors(
        token_ids=torch.cat([token_ids.unsqueeze(-1), top_ids], dim=-1),
        logprobs=torch.cat([chosen, top_logprobs], dim=-1),
        ranks=ranks,
    )


def apply_penalties(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """Repetition penalty on tokens seen in prompt or output, then OpenAI's
    presence / frequency penalties on output counts only."""
    if md.no_penalties:
        return logits
    counts = md.output_counts
    if md.repetition_penalty is not None:
        seen = md.prompt_mask | (counts > 0)
        penalty = md.repetition_penalty.unsqueeze(-1)
        # Dividing a positive logit and multiplying a negative one both lower it.
        penalized = torch.where(logits > 0, logits / penalty, logits * penalty)
        # A penalty far below 1 overflows a logit to inf, and softmax of inf is NaN: the
        # largest finite logit is the same "certain" without breaking the draw.
        big = torch.finfo(logits.dtype).max
        logits = torch.where(seen, penalized.clamp_(-big, big), logits)
    if md.frequency_penalty is not None:
        logits -= md.frequency_penalty.unsqueeze(-1) * counts
    if md.presence_penalty is not None:
        logits -= md.presence_penalty.unsqueeze(-1) * (counts > 0)
    return logits


def apply_grammar(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    if md.grammar_rows is not None:
        rows = logits[md.grammar_rows].masked_fill_(~md.grammar_allowed, float("-inf"))
        logits[md.grammar_rows] = rows
    return logits


def apply_token_maps(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """allowed_token_ids (everything else -inf), then logit_bias (added), as vLLM's order."""
    if md.allowed_rows is not None:
        rows = logits[md.allowed_rows].masked_fill_(~md.allowed_mask, float("-inf"))
        logits[md.allowed_rows] = rows
    if md.bias_rows is not None:
        logits.index_put_((md.bias_rows, md.bias_cols), md.bias_values, accumulate=True)
    return logits


def apply_min_tokens(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    if md.stop_rows is not None:
        logits[md.stop_rows, md.stop_cols] = float("-inf")
    return logits


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Row-wise argmax: loom's two-stage kernel on CUDA (torch's runs a 128k row in one
    block), torch's elsewhere. Same ties (lowest index)."""
    if _kernel_applies(logits):
        from loom.kernels.sampling import sample_rows
        return sample_rows(logits)
    return logits.argmax(dim=-1)


_KERNEL_ENABLED = envs.sampler_kernel()
"""Read once, not per step."""


def _kernel_applies(logits: torch.Tensor) -> bool:
    if not logits.is_cuda or not _KERNEL_ENABLED:
        return False
    from loom.kernels.sampling import supports
    return supports(logits)


def _sample(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    if md.all_greedy:
        return greedy_argmax(logits)
    if (md.no_top_k and md.no_top_p and md.no_min_p and not md.generators
            and (md.custom is None or not md.custom.has_invariant) and _kernel_applies(logits)):
        # Temperature only: one Gumbel-max pass, no softmax. Seeded rows keep their own
        # generators below (their draws must not depend on the batch).
        from loom.kernels.sampling import sample_rows
        seed = int(torch.randint(0, 2**31 - 1, ()).item())  # torch's seeded host generator
        return sample_rows(logits, md.temperature, md.greedy_mask, seed)
    # Greedy argmax first: the random path below rewrites the logits in place.
    greedy = None if md.all_random else logits.argmax(dim=-1)
    sampled = _random_sample(logits, md)
    if greedy is None:
        return sampled
    return torch.where(md.greedy_mask, greedy, sampled)


def _random_sample(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    return exponential_race(filtered_probs(logits, md), md)


def _sample_processed(logits: torch.Tensor,
                      md: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """The same draw as `_sample` (its general path), and the logits it was drawn from: a
    greedy row's as penalised; a random row's after temperature, top-k and top-p, with
    what min-p drops at -inf (vLLM's processed values)."""
    if md.all_greedy:
        return logits.argmax(dim=-1), logits
    greedy = None if md.all_random else logits.argmax(dim=-1)
    processed = logits.clone() if greedy is not None else None
    probs = filtered_probs(logits, md)  # `logits` now temperature-scaled and filtered
    if not md.no_min_p:
        logits.masked_fill_(probs == 0, float("-inf"))
    if processed is not None:  # a greedy row keeps its penalised logits (temperature 1)
        logits = torch.where(md.greedy_mask.unsqueeze(-1), processed, logits)
    sampled = exponential_race(probs, md)
    if greedy is not None:
        sampled = torch.where(md.greedy_mask, greedy, sampled)
    return sampled, logits


def filtered_probs(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """The random rows' distribution: temperature, top-k, top-p, then min-p (which leaves
    the row unnormalised). Rewrites `logits` in place."""
    logits.div_(md.temperature.unsqueeze(-1))
    if md.custom is not None:  # vLLM's place for argmax-invariant processors: tempered
        logits = md.custom.apply(logits, argmax_invariant=True)
    if not md.no_top_p:
        logits = apply_top_k_top_p(logits, md.top_k, md.top_p)
    elif not md.no_top_k:
        logits = apply_top_k(logits, md.top_k, md.max_top_k)
    probs = logits.softmax(dim=-1)
    if not md.no_min_p:
        probs = apply_min_p(probs, md.min_p)
    return probs


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Keep logits at or above each row's k-th largest (ties at the threshold all stay).

    A partial topk up to the largest k in use is cheaper than a full vocabulary sort; rows
    without top-k (k = vocab size) get a -inf threshold instead.
    """
    top_values = logits.topk(max_top_k, dim=-1).values
    k = top_k.unsqueeze(-1)
    threshold = top_values.gather(-1, k.clamp_max(max_top_k) - 1)
    threshold.masked_fill_(k >= logits.shape[-1], float("-inf"))
    return logits.masked_fill_(logits < threshold, float("-inf"))


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor
) -> torch.Tensor:
    """Top-k, then top-p over the top-k renormalised distribution, in one descending sort.

    Top-p keeps the smallest prefix whose probability mass reaches p: a token goes when the
    mass strictly before it already does, so the most likely token always stays.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    if top_k is not None:
        positions = torch.arange(logits.shape[-1], device=logits.device)
        sorted_logits.masked_fill_(positions >= top_k.unsqueeze(-1), float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits.masked_fill_(mass_before >= top_p.unsqueeze(-1), float("-inf"))
    return logits.scatter_(-1, order, sorted_logits)


def apply_min_p(probs: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens less likely than min_p times the row's most likely one."""
    threshold = min_p.unsqueeze(-1) * probs.amax(dim=-1, keepdim=True)
    return probs.masked_fill_(probs < threshold, 0.0)


def exponential_race(probs: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """argmax(p / q) with q ~ Exp(1) i.i.d. is a draw from p (normalised or not).

    Unlike torch.multinomial it needs no device sync, and each seeded row draws its own
    q from its own generator, so its token does not depend on the rest of the batch.
    """
    q = torch.empty_like(probs)
    if md.needs_global_rng:
        q.exponential_()
    for row, generator in md.generators.items():
        q[row].exponential_(generator=generator)
    # A q of exactly 0 would turn a filtered-out 0 probability into NaN, which argmax picks.
    q.clamp_min_(torch.finfo(q.dtype).tiny)
    return probs.div_(q).argmax(dim=-1)
