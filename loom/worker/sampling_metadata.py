"""`SamplingMetadata`: the per-request sampling parameters of one step, as batch tensors.

Built once per step by the model runner. Every optional tensor is None (and its flag set)
when no row in the batch uses it, so that the sampler skips that work entirely.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from loom.sampling_params import SamplingParams

if TYPE_CHECKING:
    from loom.worker.input_batch import CachedRequestState
    from loom.worker.logits_processors import StepProcessors

_SEED_MULTIPLIER = 1_000_003
_MASK64 = 2**64 - 1


def derive_seed(seed: int, num_outputs: int) -> int:
    """The generator seed of a request's draw after `num_outputs` tokens.

    A function of the request alone (not of the batch or of earlier steps), so that a seeded
    request samples the same tokens alone, batched, or recomputed after preemption.
    """
    return _mix64((seed * _SEED_MULTIPLIER + num_outputs) & _MASK64)


def _mix64(x: int) -> int:
    """splitmix64's finalizer, a bijection of 64-bit values whose every output bit depends
    on every input bit: the CPU generator seeds from the low 32 bits alone, so seeds apart
    by 2**32 (or -1 and 2**63 - 1, once reduced modulo 2**63) drew the same tokens."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor
    """[B] float32; 1.0 on greedy rows, whose temperature is never applied."""
    greedy_mask: torch.Tensor | None
    """[B] bool; None when all rows are greedy or all are random."""
    all_greedy: bool
    all_random: bool

    top_k: torch.Tensor | None
    """[B] int64; vocab_size where off. None when no random row uses top-k."""
    max_top_k: int
    """Largest top-k among rows that use it, known on the host so top-k needs no sync."""
    top_p: torch.Tensor | None
    """[B] float32; +inf where off, so float rounding of the cumsum never trims a row."""
    min_p: torch.Tensor | None
    """[B] float32; 0.0 where off."""

    repetition_penalty: torch.Tensor | None
    """[B] float32; None when every row has 1.0."""
    presence_penalty: torch.Tensor | None
    frequency_penalty: torch.Tensor | None
    output_counts: torch.Tensor | None
    """[B, V] float32 count of each token in the row's output; None without penalties."""
    prompt_mask: torch.Tensor | None
    """[B, V] bool, token occurs in the prompt; only the repetition penalty reads it."""

    stop_rows: torch.Tensor | None
    """Flat (row, token) pairs masked to -inf: stop tokens while the row is still under
    min_tokens, and the tokens that would complete one of its bad words."""
    stop_cols: torch.Tensor | None

    generators: dict[int, torch.Generator]
    """Per-row generators of seeded random rows."""
    needs_global_rng: bool
    """Some random row has no seed and draws from torch's global generator."""

    max_num_logprobs: int | None
    """Largest `logprobs` asked in the batch; None when nobody asked."""

    grammar_rows: torch.Tensor | None = None
    """[G] int64 rows under guided decoding; None when no row is."""
    grammar_allowed: torch.Tensor | None = None
    """[G, V] bool: the tokens each guided row's grammar allows next."""

    allowed_rows: torch.Tensor | None = None
    """[A] int64 rows with allowed_token_ids; None when no row has them."""
    allowed_mask: torch.Tensor | None = None
    """[A, V] bool: the tokens each of those rows may sample."""
    bias_rows: torch.Tensor | None = None
    """Flat (row, token, bias) triples of the rows' logit_bias; None when no row has one."""
    bias_cols: torch.Tensor | None = None
    bias_values: torch.Tensor | None = None
    custom: StepProcessors | None = None
    """The engine's custom logits processors (`loom.logits_processor`); None without any."""

    @property
    def no_top_k(self) -> bool:
        return self.top_k is None

    @property
    def no_top_p(self) -> bool:
        return self.top_p is None

    @property
    def no_min_p(self) -> bool:
        return self.min_p is None

    @property
    def no_penalties(self) -> bool:
        return self.output_counts is None

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        output_token_ids: list[list[int]],
        prompt_token_ids: list[list[int]],
        stop_ids: list[set[int]],
        seeds: list[int | None],
        device: torch.device | str,
        vocab_size: int,
        grammar_bitmasks: list[bytes | None] | None = None,
        seed_index: list[int] | None = None,
        custom: StepProcessors | None = None,
        histories: tuple[TokenSpans, TokenSpans] | None = None,
    ) -> SamplingMetadata:
        """seed_index: the output number each row samples, which seeds a seeded row's draw
        (`derive_seed`); None: the length of its output_token_ids. histories: the rows'
        outputs and prompts as spans of a token table, which the penalties read instead of
        output_token_ids and prompt_token_ids."""
        greedy = [p.greedy for p in params]
        stop_rows, stop_cols = _masked_pairs(params, output_token_ids, stop_ids,
                                                 device, vocab_size, grammar_bitmasks)
        return cls(
            **_mode_fields(params, greedy, device),
            **_filter_fields(params, greedy, device, vocab_size),
            **_penalty_fields(params, *(histories or (output_token_ids, prompt_token_ids)),
                              device, vocab_size),
            stop_rows=stop_rows,
            stop_cols=stop_cols,
            generators=_generators(greedy, seeds, seed_index or [len(o) for o in output_token_ids],
                                   device),
            needs_global_rng=any(not g and s is None for g, s in zip(greedy, seeds)),
            max_num_logprobs=max((p.logprobs for p in params if p.logprobs is not None),
                                 default=None),
            **_grammar_fields(grammar_bitmasks or [], device, vocab_size),
            **_token_map_fields(params, device, vocab_size),
            custom=custom,
        )

    @classmethod
    def for_requests(cls, reqs: list[CachedRequestState], seq_lens: list[int],
                     device: torch.device | str, vocab_size: int,
                     grammar_bitmask: dict[str, bytes] | None,
                     custom: StepProcessors | None, table: np.ndarray) -> SamplingMetadata:
        """The model runner's step: `reqs` sample in this order, each after seq_lens of its
        tokens (output number seq_len - prompt seeds a seeded row's draw); `table` holds
        each request's tokens in its row (`RequestStates.tokens`)."""
        seeded = any(r.params.seed is not None for r in reqs)
        return cls.build(
            [r.params for r in reqs], [r.output_token_ids for r in reqs], [],
            [r.stop_ids for r in reqs], [r.params.seed for r in reqs], device, vocab_size,
            [grammar_bitmask.get(r.req_id) for r in reqs] if grammar_bitmask else None,
            seed_index=[n - r.num_prompt_tokens for r, n in zip(reqs, seq_lens)]
            if seeded else None, custom=custom,
            histories=(_histories(reqs, table) if any(r.params.uses_penalties for r in reqs)
                       else None))


def _histories(reqs: list[CachedRequestState], table: np.ndarray) -> tuple[TokenSpans, ...]:
    """The requests' outputs and prompts, as spans of their token table rows (long prompts
    made copying them into lists the largest host cost of a penalized step)."""
    rows = np.fromiter((r.row for r in reqs), dtype=np.int64, count=len(reqs))
    prompt = np.fromiter((r.num_prompt_tokens for r in reqs), dtype=np.int64, count=len(reqs))
    known = np.fromiter((len(r.token_ids) for r in reqs), dtype=np.int64, count=len(reqs))
    return (TokenSpans(table, rows, prompt, known),
            TokenSpans(table, rows, np.zeros_like(prompt), prompt))


def _mode_fields(
    params: list[SamplingParams], greedy: list[bool], device: torch.device | str
) -> dict[str, object]:
    all_greedy, all_random = all(greedy), not any(greedy)
    return dict(
        temperature=_floats([1.0 if g else p.temperature for p, g in zip(params, greedy)],
                            device),
        greedy_mask=(None if all_greedy or all_random
                     else _upload(torch.tensor(greedy, dtype=torch.bool), device)),
        all_greedy=all_greedy,
        all_random=all_random,
    )


def _filter_fields(
    params: list[SamplingParams], greedy: list[bool], device: torch.device | str,
    vocab_size: int,
) -> dict[str, object]:
    top_k = [_top_k_or_off(p, g, vocab_size) for p, g in zip(params, greedy)]
    top_p = [_top_p_or_off(p, g) for p, g in zip(params, greedy)]
    min_p = [0.0 if g else p.min_p for p, g in zip(params, greedy)]
    uses_top_k = any(k < vocab_size for k in top_k)
    return dict(
        top_k=_upload(torch.tensor(top_k, dtype=torch.long), device) if uses_top_k else None,
        max_top_k=max((k for k in top_k if k < vocab_size), default=vocab_size),
        top_p=_floats(top_p, device) if any(p < 1.0 for p in top_p) else None,
        min_p=_floats(min_p, device) if any(p > 0.0 for p in min_p) else None,
    )


def _floats(values: list[float], device: torch.device | str) -> torch.Tensor:
    return _upload(torch.tensor(values, dtype=torch.float32), device)


def _upload(cpu: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on the device without waiting for the device: a plain copy from
    pageable memory syncs the stream, which would stall the step launched before this one."""
    device = torch.device(device)
    if device.type != "cuda":
        return cpu
    return cpu.pin_memory().to(device, non_blocking=True)


def _top_k_or_off(p: SamplingParams, greedy: bool, vocab_size: int) -> int:
    # Filters never change a greedy row's argmax, so greedy rows count as unfiltered.
    if greedy or p.top_k <= 0:
        return vocab_size
    return min(p.top_k, vocab_size)


def _top_p_or_off(p: SamplingParams, greedy: bool) -> float:
    return float("inf") if greedy or p.top_p >= 1.0 else max(p.top_p, _F32_TINY)


_F32_TINY = float(torch.finfo(torch.float32).tiny)
"""The least normal float32. A positive top_p or repetition_penalty below it would round to
0 in the float32 tensors: top_p 0 masks every token (token 0 comes out), a penalty of 0
divides by zero. Clamped to it they keep their meaning (only the top token; the strongest
penalty)."""


def _penalty_fields(
    params: list[SamplingParams],
    output_token_ids: list[list[int]],
    prompt_token_ids: list[list[int]],
    device: torch.device | str,
    vocab_size: int,
) -> dict[str, torch.Tensor | None]:
    uses_rep = any(p.repetition_penalty != 1.0 for p in params)
    uses_pres = any(p.presence_penalty != 0.0 for p in params)
    uses_freq = any(p.frequency_penalty != 0.0 for p in params)
    fields: dict[str, torch.Tensor | None] = dict.fromkeys(
        ("repetition_penalty", "presence_penalty", "frequency_penalty",
         "output_counts", "prompt_mask"))
    if not (uses_rep or uses_pres or uses_freq):
        return fields
    fields["output_counts"] = _token_counts(output_token_ids, device, vocab_size)
    if uses_rep:
        fields["repetition_penalty"] = _floats([max(p.repetition_penalty, _F32_TINY)
                                                for p in params], device)
        fields["prompt_mask"] = _token_counts(prompt_token_ids, device, vocab_size) > 0
    if uses_pres:
        fields["presence_penalty"] = _floats([p.presence_penalty for p in params], device)
    if uses_freq:
        fields["frequency_penalty"] = _floats([p.frequency_penalty for p in params], device)
    return fields


@dataclass
class TokenSpans:
    """Each row's tokens as a span of a token table's row: table[rows[i], starts[i]:ends[i]]
    (the model runner's `RequestStates.tokens`), gathered with numpy rather than copied
    into Python lists: a batch's prompts are its longest histories."""
    table: np.ndarray
    rows: np.ndarray
    starts: np.ndarray
    ends: np.ndarray

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """(row of each token, the token), every row's tokens in order."""
        lengths = self.ends - self.starts
        row_of = np.repeat(np.arange(len(lengths)), lengths)
        first = np.cumsum(lengths) - lengths
        offsets = np.arange(int(lengths.sum())) - first[row_of]
        return row_of, self.table[self.rows[row_of], self.starts[row_of] + offsets]


def _token_counts(
    tokens: list[list[int]] | TokenSpans, device: torch.device | str, vocab_size: int
) -> torch.Tensor:
    """[B, V] float32 occurrence counts, from one flat index tensor (no per-row padding)."""
    # Row indices are expanded on the host: repeat_interleave on a device would sync on
    # its data-dependent output size.
    if isinstance(tokens, TokenSpans):
        row_of, flat = tokens.flat()
        num_rows = len(tokens.rows)
    else:
        row_of = np.repeat(np.arange(len(tokens)), [len(ids) for ids in tokens])
        flat = np.fromiter(itertools.chain.from_iterable(tokens), dtype=np.int64)
        num_rows = len(tokens)
    rows = _upload(torch.from_numpy(row_of.astype(np.int64)), device)
    cols = _upload(torch.from_numpy(flat.astype(np.int64)), device)
    counts = torch.zeros(num_rows, vocab_size, dtype=torch.float32, device=device)
    ones = torch.ones(cols.shape, dtype=torch.float32, device=device)
    return counts.index_put_((rows, cols), ones, accumulate=True)


def _masked_pairs(
    params: list[SamplingParams],
    output_token_ids: list[list[int]],
    stop_ids: list[set[int]],
    device: torch.device | str,
    vocab_size: int,
    grammar_bitmasks: list[bytes | None] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    # A stop id outside the model's vocabulary can never be sampled, so it needs no mask.
    bitmasks = grammar_bitmasks or [None] * len(params)
    pairs = [(row, tok)
             for row, (p, out, stops, mask) in enumerate(zip(params, output_token_ids,
                                                             stop_ids, bitmasks))
             if len(out) < p.min_tokens and not _grammar_only_ends(mask, stops)
             for tok in sorted(stops) if 0 <= tok < vocab_size]
    pairs += [(row, seq[-1]) for row, (p, out) in enumerate(zip(params, output_token_ids))
              for seq in p.bad_words_token_ids
              if len(seq) == 1 or out[len(out) - len(seq) + 1:] == seq[:-1]]
    if not pairs:
        return None, None
    flat = _upload(torch.tensor(pairs, dtype=torch.long), device)
    return flat[:, 0], flat[:, 1]


def _token_map_fields(params: list[SamplingParams], device: torch.device | str,
                      vocab_size: int) -> dict[str, torch.Tensor | None]:
    """allowed_token_ids as a mask over the rows that give them, logit_bias as flat triples."""
    fields: dict[str, torch.Tensor | None] = {}
    allowed = [(row, p.allowed_token_ids) for row, p in enumerate(params)
               if p.allowed_token_ids is not None]
    if allowed:
        mask = torch.zeros(len(allowed), vocab_size, dtype=torch.bool)
        for i, (_, ids) in enumerate(allowed):
            mask[i, ids] = True
        fields["allowed_rows"] = _upload(torch.tensor([r for r, _ in allowed]), device)
        fields["allowed_mask"] = _upload(mask, device)
    triples = [(row, token, bias) for row, p in enumerate(params)
               for token, bias in (p.logit_bias or {}).items()]
    if triples:
        rows, cols, values = zip(*triples)
        fields["bias_rows"] = _upload(torch.tensor(rows), device)
        fields["bias_cols"] = _upload(torch.tensor(cols), device)
        fields["bias_values"] = _floats(list(values), device)
    return fields


def _grammar_only_ends(bitmask: bytes | None, stops: set[int]) -> bool:
    """Whether a guided row's grammar allows nothing but stop tokens: its constraint is
    complete, so it ends here whatever min_tokens asks (masking the stops as well would
    leave no token at all, and the row would sample token 0)."""
    if bitmask is None:
        return False
    allowed = np.flatnonzero(np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8),
                                           bitorder="little"))
    return bool(len(allowed)) and set(allowed.tolist()) <= stops


def _generators(
    greedy: list[bool],
    seeds: list[int | None],
    seed_index: list[int],
    device: torch.device | str,
) -> dict[int, torch.Generator]:
    gens: dict[int, torch.Generator] = {}
    for row, (g, seed, index) in enumerate(zip(greedy, seeds, seed_index)):
        if g or seed is None:
            continue
        gen = torch.Generator(device=device)
        gen.manual_seed(derive_seed(seed, index))
        gens[row] = gen
    return gens


def _grammar_fields(
    bitmasks: list[bytes | None], device: torch.device | str, vocab_size: int
) -> dict[str, torch.Tensor | None]:
    """Unpack llguidance bitmasks (bit i of int32 word j allows token 32 * j + i) on the
    device. Tokens past the tokenizer's vocabulary (a padded embedding) are never allowed."""
    rows = [i for i, mask in enumerate(bitmasks) if mask is not None]
    if not rows:
        return dict(grammar_rows=None, grammar_allowed=None)
    words = torch.stack([torch.frombuffer(bytearray(bitmasks[i]), dtype=torch.int32)
                         for i in rows])
    words = _upload(words, device)
    shifts = torch.arange(32, dtype=torch.int32, device=device)
    bits = ((words.unsqueeze(-1) >> shifts) & 1).flatten(1)
    if bits.shape[1] < vocab_size:
        bits = torch.nn.functional.pad(bits, (0, vocab_size - bits.shape[1]))
    return dict(grammar_rows=_upload(torch.tensor(rows, dtype=torch.long), device),
                grammar_allowed=bits[:, :vocab_size].bool())
