"""A mixed step's requests split by kind for the Triton backend: its decodes (a query of one
token) go to the split-K decode kernel and its prompt chunks to the varlen kernel, each over a
device list of request indices, uploaded once per step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from loom.attention.backend import AttentionMetadata
from loom.pinned import pinned_empty


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
    decode_index, prefill_index = _upload_indices([decode, prefill], device)
    return MixedSplit(decode_index, prefill_index, longest, int(q_lens[prefill].max()))


_INDEX_ALIGN = 64
"""int32 entries (256 bytes) each list starts on: Triton compiles a kernel variant per pointer
alignment, so the second list's address must not depend on the first one's length."""


class _PinnedRing:
    """Pinned host buffers used in turn for the index uploads. A buffer is rewritten only
    after the copy made from it len(buffers) uploads ago has finished (an event; at one
    upload per mixed step, with at most a few steps in flight, that is long past)."""

    def __init__(self, size: int = 8) -> None:
        self._buffers: list[torch.Tensor | None] = [None] * size
        self._events: list[torch.cuda.Event | None] = [None] * size
        self._turn = 0

    def upload(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        self._turn = (self._turn + 1) % len(self._buffers)
        event, buf = self._events[self._turn], self._buffers[self._turn]
        if event is not None:
            event.synchronize()
        if buf is None or buf.numel() < host.numel():
            buf = pinned_empty(max(host.numel(), 1024), host.dtype)
            self._buffers[self._turn] = buf
        staged = buf[:host.numel()]
        staged.copy_(host)
        dev = torch.empty_like(staged, device=device)
        dev.copy_(staged, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._events[self._turn] = event
        return dev


_PINNED = _PinnedRing()


def _upload_indices(lists: list[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """int32 device tensors of the index arrays, in one host-to-device copy (non-blocking,
    from pinned memory, on CUDA), each starting 256-byte aligned."""
    offsets, total = [], 0
    for entries in lists:
        offsets.append(total)
        total += -(-len(entries) // _INDEX_ALIGN) * _INDEX_ALIGN
    packed = np.zeros(max(total, 1), dtype=np.int32)
    for entries, o in zip(lists, offsets):
        packed[o:o + len(entries)] = entries
    host = torch.from_numpy(packed)
    dev = _PINNED.upload(host, device) if device.type == "cuda" else host.to(device)
    return [dev[o:o + len(entries)] for entries, o in zip(lists, offsets)]
