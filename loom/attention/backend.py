"""The attention backend interface and the per-step metadata every backend reads.

KV cache layout, per layer: `[2, num_blocks, block_size, num_kv_heads, head_dim]`
(index 0 keys, 1 values), in the model's dtype or 8-bit (`CacheConfig.cache_dtype`: writers
store a value as torch converts it, saturated; readers attend over what the cache holds).
A token's slot is `block_id * block_size + offset`.
The batch is flat: the query tokens of request i are rows
`query_start_loc[i]:query_start_loc[i+1]`, and they are the last query tokens of its
`seq_lens[i]` tokens (context already in the cache, then the new ones).
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass
from typing import NamedTuple

import torch

from loom.layers.norm import QKNorm
from loom.layers.rotary import rotate_at


class ScoreOpts(NamedTuple):
    """What one layer does to its attention scores beyond the causal mask and the scale.
    Constant per layer: the attention op takes them as arguments, so compiled graphs and
    CUDA graphs bake them in."""

    sliding_window: int | None = None
    """A query at position p sees the keys at (p - sliding_window, p], as transformers'
    sliding_window_overlay masks them (Mistral v0.1, Phi-3, Gemma's local layers); None:
    every key up to p."""
    softcap: float | None = None
    """Scores s (scale applied) become tanh(s / softcap) * softcap before the softmax
    (Gemma 2's attn_logit_softcapping); None: as they are."""

    @property
    def plain(self) -> bool:
        return self.sliding_window is None and self.softcap is None


PLAIN = ScoreOpts()


@dataclass
class AttentionMetadata:
    num_actual_tokens: int
    """Real tokens in the batch; rows past it are padding (CUDA graphs, TP multiples)."""
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor
    """[num_reqs + 1] int32, on the device."""
    seq_lens: torch.Tensor
    """[num_reqs] int32, on the device."""
    block_table: torch.Tensor
    """[num_reqs, max_blocks_per_req] int32, on the device."""
    slot_mapping: torch.Tensor
    """[num_tokens] int64, on the device; -1 for padding rows (no write)."""
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    fixed_shape: bool = False
    """A CUDA graph's metadata (`CUDAGraphRunner`): num_actual_tokens, num_reqs,
    max_query_len and max_seq_len are the graph's bounds, and only the device tensors hold
    this batch's values (the host-side ones are the capture's). A decode graph's batch is
    padded with requests of one key; a mixed graph's (max_query_len > 1) with requests of
    empty queries and rows past the batch's tokens. A backend takes one path for every such
    batch, deciding nothing from the host-side values."""

    @property
    def is_pure_decode(self) -> bool:
        return self.max_query_len == 1

    # Read once per step, not once per layer: an eagerly run prefill is bound by host time.
    @functools.cached_property
    def host_bounds(self) -> tuple[list[int], list[int]]:
        """query_start_loc[:num_reqs + 1] and seq_lens[:num_reqs] as Python lists."""
        if self.fixed_shape:
            raise ValueError("host_bounds: a fixed-shape (CUDA graph) batch's host-side values "
                             "are not its own; read the device tensors")
        return (self.query_start_loc_cpu[:self.num_reqs + 1].tolist(),
                self.seq_lens_cpu[:self.num_reqs].tolist())

    @functools.cached_property
    def is_fresh_prefill(self) -> bool:
        """Every request's query is its whole sequence (no cached context before it)."""
        starts, seq_lens = self.host_bounds
        return all(end - start == n for start, end, n in zip(starts, starts[1:], seq_lens))


class AttentionBackend(abc.ABC):
    """Writes new keys/values into the paged cache and attends over it."""

    name: str = "abstract"
    fuses_rope: bool = False
    """Whether rope_write_kv rotates inside the cache-write kernel. The model runner then
    leaves rotary to the attention op (`loom.layers.attention.set_fused_rope`); otherwise
    the compiled graph rotates q and k itself, where Inductor fuses it with its neighbours."""

    @abc.abstractmethod
    def write_kv(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        """Store key/value [T, num_kv_heads, head_dim] at slot_mapping[:T] (skip -1)."""

    def rope_write_kv(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                      kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                      kv_out: torch.Tensor | None = None,
                      qk_norm: QKNorm | None = None) -> torch.Tensor:
        """Rotate query [T, num_heads, head_dim] and key at positions[:T] (rotate-half;
        cos_sin_cache is `RotaryEmbedding.cos_sin_cache`), write_kv the rotated key and the
        value, and return the rotated query; kv_out [2, T, num_kv_heads, head_dim], when
        given, receives the rotated key and the value too. qk_norm: normalise each query
        and key head before rotating it. This default is the reference: torch's norm and
        rotation, then write_kv."""
        positions = positions[:query.shape[0]]
        if qk_norm is not None:
            query, key = qk_norm.apply(query, key)
        key = rotate_at(positions, key, cos_sin_cache)
        self.write_kv(key, value, kv_cache, slot_mapping)
        if kv_out is not None:
            kv_out[0].copy_(key)
            kv_out[1].copy_(value)
        return rotate_at(positions, query, cos_sin_cache)

    def decode_rope(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                    kv_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, qk_norm: QKNorm | None = None,
                    opts: ScoreOpts = PLAIN) -> torch.Tensor | None:
        """A pure decode step whole, from unrotated (and, with qk_norm, unnormalised) query
        and key: normalise, rotate, write the cache and attend, in fewer launches than
        rope_write_kv then forward. None (this default): the backend has no such path, and
        the caller takes those two."""
        return None

    def fits_one_launch(self, meta: AttentionMetadata) -> bool:
        """Whether this batch (not fixed-shape) would lose nothing in a fixed-shape CUDA
        graph's attention (`AttentionMetadata.fixed_shape`): yes by default."""
        return True

    def attends_batch_kv(self, meta: AttentionMetadata, kv_cache: torch.Tensor,
                         key: torch.Tensor, opts: ScoreOpts = PLAIN) -> bool:
        """Whether `forward` would attend over this batch's own keys and values (passed as
        batch_kv) rather than read them back from the cache: none by default."""
        return False

    @abc.abstractmethod
    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, batch_kv: tuple[torch.Tensor, torch.Tensor] | None = None,
                opts: ScoreOpts = PLAIN) -> torch.Tensor:
        """Causal attention of query [T, num_heads, head_dim] over each request's cached
        keys/values (already including this step's); returns [T, num_heads, head_dim].
        GQA: num_heads is a multiple of num_kv_heads. batch_kv: this step's rotated keys and
        values [T, num_kv_heads, head_dim], passed where `attends_batch_kv` said so. opts:
        the layer's sliding window and score softcap. Every cached key stays in the cache,
        those a window has left behind too (no block is freed early)."""
