"""A mixed step's requests split by kind for the Triton backend: its decodes (a query of one
token) go to the split-K decode kernel and its prompt chunks to the varlen kernel, each over a
device list of request indices, uploaded once per step. Queries of a few tokens (a speculative
step's verify) take the split-K kernel too (`short_query_tokens`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from loom.attention.backend import PLAIN, AttentionMetadata, ScoreOpts
from loom.kernels.host import next_power_of_2
from loom.pinned import upload


SHORT_QUERY_TOKENS = 8
SHORT_QUERY_ELEMENTS = 64 * 128
"""Queries of up to SHORT_QUERY_TOKENS tokens (a speculative step's verify: 1 + k) take the
split-K decode kernel, its tile's rows their tokens x the GQA group (each padded to a power
of two), while those rows x the head dim stay within SHORT_QUERY_ELEMENTS (the decode tile's
registers). The varlen kernel gave such a query one program per KV head, each reading all
its keys alone: 8 programs at batch 1 of Llama-3.1-8B."""


def short_query_tokens(max_query_len: int, group: int, head_dim: int,
                       opts: ScoreOpts = PLAIN) -> int | None:
    """The decode kernel's q_tokens (`paged_decode`) for queries of at most max_query_len
    tokens where it takes them (SHORT_QUERY_TOKENS; not in a layer with a sliding window);
    else None."""
    q_tokens = next_power_of_2(max_query_len)
    if opts.sliding_window is not None or q_tokens > SHORT_QUERY_TOKENS or \
            q_tokens * next_power_of_2(group) * head_dim > SHORT_QUERY_ELEMENTS:
        return None
    return q_tokens


@dataclass(frozen=True)
class MixedSplit:
    """A mixed step's requests by kind: decodes (a query of one token) and the others
    (prompt chunks; requests with no query this step are in neither)."""

    decode_index: torch.Tensor
    """int32 [num_decode] on the device: the decodes' request indices, in batch order."""
    prefill_index: torch.Tensor
    """int32 [num_prefill] on the device: the other requests' indices."""
    decode_max_seq_len: int
    prefill_max_query_len: int


def splits_mixed(num_decodes: int, longest: int, min_decodes: int,
                 min_context: int | None) -> bool:
    """Whether a mixed step of num_decodes decodes, the longest reading `longest` tokens, is
    split: from min_decodes decodes, or (min_context given) a decode of min_context tokens."""
    return num_decodes >= min_decodes or (min_context is not None and longest >= min_context)


def by_kind(meta: AttentionMetadata) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The batch's query lengths, its decodes' indices (a query of one token), the others'
    (requests with no query this step in neither), and the longest decode's tokens (0
    without one), from the host-side bounds."""
    starts, seq_lens = meta.host_bounds
    q_lens = np.diff(np.asarray(starts, dtype=np.int64))
    decode, prefill = np.flatnonzero(q_lens == 1), np.flatnonzero(q_lens > 1)
    longest = int(np.asarray(seq_lens, dtype=np.int64)[decode].max()) if len(decode) else 0
    return q_lens, decode, prefill, longest


def split_by_query_len(meta: AttentionMetadata, device: torch.device, min_decodes: int = 1,
                       min_context: int | None = None) -> MixedSplit | None:
    """The split of a step that has both kinds of request, where `splits_mixed` says so;
    else None (one launch serves)."""
    q_lens, decode, prefill, longest = by_kind(meta)
    if not len(decode) or not len(prefill):
        return None
    if not splits_mixed(len(decode), longest, min_decodes, min_context):
        return None
    decode_index, prefill_index = upload([decode.astype(np.int32), prefill.astype(np.int32)],
                                         device)
    return MixedSplit(decode_index, prefill_index, longest, int(q_lens[prefill].max()))
