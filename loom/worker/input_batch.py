"""Per-request state the worker keeps between steps, and the flat batch built from it.

The scheduler sends a request in full once and then only diffs; `RequestStates` applies
them. `build_batch` turns one step's schedule into flat tensors with numpy (no per-token
Python loops).
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from loom.attention.backend import AttentionMetadata
from loom.core.sched_output import SchedulerOutput
from loom.lora.request import LoRARequest
from loom.pinned import upload
from loom.pooling_params import PoolingParams
from loom.sampling_params import SamplingParams
from loom.worker.spec_verify import SpecRows


@dataclass
class CachedRequestState:
    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    block_ids: list[int]
    eos_token_id: int | None
    num_computed_tokens: int = 0
    pooling_params: PoolingParams | None = None
    """Set for an embedding request: its rows are pooled, it never samples."""
    row: int = -1
    """Its row in RequestStates' token and block tables."""
    spec_token_ids: list[int] = field(default_factory=list)
    """Draft tokens after its known ones this step (speculative decoding); they sit in the
    token table past token_ids until verified."""
    lora_request: LoRARequest | None = None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that changes or reports the distribution: argmax is the
        answer."""
        p = self.params
        min_tokens_pending = len(self.token_ids) - self.num_prompt_tokens < p.min_tokens
        return (p.greedy and p.logprobs is None and not p.shapes_logits
                and not (min_tokens_pending and self.stop_ids) and p.guided_decoding is None)

    @property
    def reads_outputs(self) -> bool:
        """Whether its sampling reads its output tokens' values or count (penalties, bad
        words, min_tokens masking stop tokens), which must then include any in flight."""
        p = self.params
        return (p.uses_penalties or bool(p.bad_words_token_ids)
                or (p.min_tokens > 0 and bool(self.stop_ids)))

    @property
    def stop_ids(self) -> set[int]:
        """Tokens masked while fewer than min_tokens have been generated."""
        ids = set(self.params.stop_token_ids)
        if self.eos_token_id is not None and not self.params.ignore_eos:
            ids.add(self.eos_token_id)
        return ids


class RequestStates(dict[str, CachedRequestState]):
    """The running requests, plus their token ids and block ids mirrored into fixed numpy
    tables (one row per request), so a step gathers its inputs with array indexing rather
    than a Python loop over the batch. Untouched table pages are never committed."""

    def __init__(self, max_reqs: int, max_model_len: int, block_size: int) -> None:
        super().__init__()
        # int32: 1024 requests x 128k positions is 512 MiB rather than 1 GiB per worker.
        try:
            self.tokens = np.zeros((max_reqs, max_model_len), dtype=np.int32)
            self.blocks = np.zeros((max_reqs, -(-max_model_len // block_size)), dtype=np.int64)
        except MemoryError:
            raise ValueError(f"max_num_seqs x max_model_len: {max_reqs} x {max_model_len} "
                             "token slots do not fit in host memory; lower either") from None
        self._free_rows = list(range(max_reqs - 1, -1, -1))
        self.num_drafting = 0
        """Requests with drafts in the step last applied (0: the batch skips that work)."""
        self.num_reading = 0
        """Requests whose sampling reads their outputs (0: no step needs to catch up)."""

    def add(self, state: CachedRequestState) -> None:
        if not self._free_rows:
            raise RuntimeError(f"more than {len(self.tokens)} running requests reached a worker")
        state.row = self._free_rows.pop()
        self[state.req_id] = state
        self.num_reading += state.reads_outputs
        self.tokens[state.row, :len(state.token_ids)] = state.token_ids
        self.blocks[state.row, :len(state.block_ids)] = state.block_ids

    def remove(self, req_id: str) -> None:
        state = self.pop(req_id, None)
        if state is not None:
            self._free_rows.append(state.row)
            self.num_reading -= state.reads_outputs

    def apply(self, so: SchedulerOutput) -> list[CachedRequestState]:
        """Apply one step's diff; return the scheduled requests in batch order."""
        for req_id in so.finished_req_ids:
            self.remove(req_id)
        for new in so.new_reqs:
            self.add(CachedRequestState(
                new.req_id, list(new.token_ids), new.num_prompt_tokens, new.sampling_params,
                list(new.block_ids), new.eos_token_id, new.num_computed_tokens,
                new.pooling_params, lora_request=new.lora_request))
        self.num_drafting = 0
        for cached in so.cached_reqs:
            self._apply_cached(self[cached.req_id], cached)
        return [self[req_id] for req_id in so.num_scheduled_tokens]

    def _apply_cached(self, state: CachedRequestState, cached) -> None:
        if cached.new_block_ids:
            n = len(state.block_ids)
            self.blocks[state.row, n:n + len(cached.new_block_ids)] = cached.new_block_ids
            state.block_ids.extend(cached.new_block_ids)
        state.num_computed_tokens = cached.num_computed_tokens
        state.spec_token_ids = cached.spec_token_ids
        if cached.spec_token_ids:  # after the step's first token (which may be in flight)
            self.num_drafting += 1
            n = cached.num_computed_tokens + 1
            self.tokens[state.row, n:n + len(cached.spec_token_ids)] = cached.spec_token_ids

    def append_sampled(self, state: CachedRequestState, position: int,
                       token_ids: list[int]) -> None:
        """Record tokens this rank sampled (or received) from `position` on, once their
        step's output is read back; a request dropped or re-sent since then is left alone."""
        if self.get(state.req_id) is state and len(state.token_ids) == position:
            self.tokens[state.row, position:position + len(token_ids)] = token_ids
            state.token_ids.extend(token_ids)


class SampledSteps:
    """The last few launched steps, for reading their sampled tokens back early.

    A request runs ahead of its sampled token (async scheduling): its next step is launched
    before that token is read back. Where the next step's sampling reads the request's
    outputs (penalties, bad words, min_tokens, custom logits processors), `catch_up` reads
    the steps still unread back first, as vLLM does. Each waits on its own step's event
    (`StepHandle.sampled`), not on the step being sampled, so the device keeps working."""

    def __init__(self, every: bool, depth: int = 2) -> None:
        """every: all requests read their outputs (custom logits processors are loaded)."""
        self.every = every
        self._steps: deque = deque(maxlen=depth)
        """Weak references to StepHandles, oldest first; depth covers every step launched
        and unread. (A handle refers to the runner: strong ones would make a cycle, which
        the collector never frees once start-up froze the runner, `heap.settle`, and the
        runner holds the device's weights and KV cache.)"""

    def record(self, handle) -> None:
        self._steps.append(weakref.ref(handle))

    def catch_up(self, states: RequestStates, reqs: list[CachedRequestState],
                 rows: list[int], lands: list[int]) -> None:
        """Before `reqs` sample (the step's requests at rows; each request's token lands at
        lands[row]), read back the steps in flight if one of them reads its outputs."""
        every = self.every
        if not (every or states.num_reading):
            return  # the common step: nothing per row
        if any(len(r.token_ids) < lands[i] and (every or r.reads_outputs)
               for r, i in zip(reqs, rows)):
            for ref in self._steps:
                handle = ref()  # None: read back and dropped already
                if handle is not None:
                    handle.sampled()


@dataclass
class StepBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    sample_rows: list[int]
    """Index into the batch's requests of those that sample a token this step."""
    logits_indices: torch.Tensor
    """Token rows whose logits are computed: the last scheduled token of each sampling
    request, then (speculative decoding) the row judging each draft, spec.hidden_rows."""
    prompt_logprob_rows: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    """req_id -> (token rows, next prompt token ids) for prompt logprobs this step."""
    spec: SpecRows | None = None
    """Speculative decoding's drafts to verify this step; None when no request drafts."""
    spec_arrays: list[torch.Tensor] = field(default_factory=list)
    """spec's counts, draft ids, sample rows and positions, on the device."""

    @property
    def sampled_shape(self) -> tuple[int, ...]:
        """The sampled tokens' shape: one per sampling request, or K + 1 with drafts."""
        if self.spec is None:
            return (len(self.sample_rows),)
        return (len(self.sample_rows), int(self.spec.counts.max()) + 1)


PendingTokens = tuple[torch.Tensor, dict[str, int]]
"""The previous step's sampled tokens, on the device, and each sampling request's index
into them: the input of a decode whose token has not been read back yet."""


def build_batch(states: RequestStates, reqs: list[CachedRequestState], num_scheduled: list[int],
                block_size: int, device: torch.device, token_multiple: int = 1,
                pending: PendingTokens | None = None, pad_to: int | None = None) -> StepBatch:
    """token_multiple > 1 pads the token rows up to a multiple (sequence parallelism splits
    them evenly over the TP ranks), pad_to up to that many rows (a piecewise CUDA graph's
    size); padding rows have id 0, position 0 and slot -1 (no KV write), sit past
    num_actual_tokens and are never read back.

    A position past a request's known tokens is the token its previous step sampled: it
    is copied on the device from `pending`, so this batch can be built and launched before
    that step's output reaches the host. Everything goes to the device in one copy from
    pinned memory, which does not wait for the device's queue."""
    counts = np.asarray(num_scheduled, dtype=np.int64)
    computed = np.asarray([r.num_computed_tokens for r in reqs], dtype=np.int64)
    known = np.asarray([len(r.token_ids) for r in reqs], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    req_of_row = np.repeat(np.arange(len(reqs)), counts)
    positions = np.arange(starts[-1]) - starts[req_of_row] + computed[req_of_row]
    rows = np.asarray([r.row for r in reqs], dtype=np.int64)
    input_ids = states.tokens[rows[req_of_row], positions].astype(np.int64)
    in_flight = positions >= known[req_of_row]
    if states.num_drafting:  # in flight, but for the drafts (after each one's first token)
        drafts_from = np.asarray([r.num_computed_tokens + 1 if r.spec_token_ids else 1 << 62
                                  for r in reqs], dtype=np.int64)
        in_flight &= positions < drafts_from[req_of_row]
    pending_dst = np.flatnonzero(in_flight)
    pending_src = _pending_sources(reqs, req_of_row[pending_dst], pending)
    seq_lens = computed + counts
    block_table = states.blocks[rows, :-(-int(seq_lens.max()) // block_size)]
    slots = block_table[req_of_row, positions // block_size] * block_size + positions % block_size
    pad = max(-len(input_ids) % token_multiple, (pad_to or 0) - len(input_ids))
    if pad:
        input_ids, positions = np.pad(input_ids, (0, pad)), np.pad(positions, (0, pad))
        slots = np.pad(slots, (0, pad), constant_values=-1)
    sample_rows = [i for i, r in enumerate(reqs)
                   if seq_lens[i] >= known[i] and r.pooling_params is None]
    starts32, seq_lens32 = starts.astype(np.int32), seq_lens.astype(np.int32)
    last_rows = starts[1:][sample_rows] - 1
    spec = (SpecRows.build([reqs[i].spec_token_ids for i in sample_rows], last_rows)
            if states.num_drafting else None)
    spec_arrays = [] if spec is None else [spec.counts, spec.draft_ids, spec.sample_row,
                                           spec.position]
    if spec is not None:  # one LM head pass for both
        last_rows = np.concatenate([last_rows, spec.hidden_rows])
    (input_ids_d, positions_d, slots_d, logits_d, dst_d, src_d, starts_d, seq_lens_d,
     block_table_d, *spec_d) = upload([input_ids, positions, slots, last_rows, pending_dst,
                                       pending_src, starts32, seq_lens32,
                                       block_table.astype(np.int32), *spec_arrays], device)
    if len(pending_dst):
        input_ids_d[dst_d] = pending[0][src_d]
    meta = AttentionMetadata(
        num_actual_tokens=int(starts[-1]), num_reqs=len(seq_lens),
        max_query_len=int(counts.max()), max_seq_len=int(seq_lens.max()),
        query_start_loc=starts_d, seq_lens=seq_lens_d, block_table=block_table_d,
        slot_mapping=slots_d, query_start_loc_cpu=torch.from_numpy(starts32),
        seq_lens_cpu=torch.from_numpy(seq_lens32))
    return StepBatch(input_ids=input_ids_d, positions=positions_d, attn_metadata=meta,
                     sample_rows=sample_rows, logits_indices=logits_d,
                     prompt_logprob_rows=_prompt_logprob_rows(reqs, computed, counts, starts),
                     spec=spec, spec_arrays=spec_d)


def _pending_sources(reqs, pending_reqs: np.ndarray, pending: PendingTokens | None) -> np.ndarray:
    index = pending[1] if pending is not None else {}
    try:
        return np.asarray([index[reqs[i].req_id] for i in pending_reqs], dtype=np.int64)
    except KeyError as e:
        raise RuntimeError(f"request {e.args[0]!r}: its next input token was sampled by a step "
                           "other than the previous one and never read back") from None


def _prompt_logprob_rows(reqs, computed, counts, starts) -> dict:
    """Rows whose next token is a prompt token, for requests that asked for prompt logprobs."""
    out = {}
    for i, r in enumerate(reqs):
        if r.params.prompt_logprobs is None:
            continue
        first, end = computed[i], min(computed[i] + counts[i], r.num_prompt_tokens - 1)
        if end <= first:
            continue
        positions = np.arange(first, end)
        out[r.req_id] = (starts[i] + positions - first, np.asarray(r.token_ids)[positions + 1])
    return out
