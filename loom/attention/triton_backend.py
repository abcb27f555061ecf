"""The GPU attention backend: Triton kernels over the paged KV cache.

Pure decode steps take the split-K flash-decoding kernel; prefill and mixed steps take the
varlen paged kernel. A pure prefill of few requests with no cached context takes PyTorch's
SDPA instead (its flash kernels beat a generic Triton tile there), after gathering each
request's keys from the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from loom import envs
from loom.attention.backend import AttentionBackend, AttentionMetadata
from loom.attention.torch_native import gather_kv
from loom.kernels.kv_write import write_kv_cache
from loom.kernels.paged_attention import default_num_splits, paged_decode, paged_prefill
from loom.kernels.rope_kv_write import rope_write_kv_cache


@dataclass(frozen=True)
class TritonTiles:
    """Tile shapes; None picks a default from the head dim."""

    prefill_block_m: int | None = None
    """Rows per prefill tile: query tokens x (GQA group padded to a power of two)."""
    prefill_block_n: int | None = None
    decode_block_n: int | None = None
    num_splits: int | None = None
    """Decode splits per (request, KV head); fix it when capturing CUDA graphs."""
    sdpa_max_reqs: int = 4
    """Pure prefills of at most this many requests go to SDPA; 0 turns SDPA off."""
    sdpa_min_tokens: int | None = None
    """...and of at least this many tokens (None: LOOM_SDPA_MIN_TOKENS, default 0). Below,
    the paged kernel's one launch may beat SDPA's host work (a cast, a gather and cuDNN's
    plan lookup per layer) in a prefill run eagerly; not yet measured on a GPU."""


class TritonBackend(AttentionBackend):
    name = "triton"
    fuses_rope = True

    def __init__(self, tiles: TritonTiles | None = None) -> None:
        self.tiles = tiles or TritonTiles()
        self.sdpa_min_tokens = (self.tiles.sdpa_min_tokens
                                if self.tiles.sdpa_min_tokens is not None
                                else envs.sdpa_min_tokens())

    def write_kv(self, key, value, kv_cache, slot_mapping):
        write_kv_cache(key, value, kv_cache, slot_mapping[:key.shape[0]])

    def rope_write_kv(self, query, key, value, positions, cos_sin_cache, kv_cache,
                      slot_mapping, kv_out=None):
        # One kernel for both: at decode each alone is mostly launch and ramp-up.
        return rope_write_kv_cache(query, key, value, positions, cos_sin_cache, kv_cache,
                                   slot_mapping, kv_out=kv_out)

    def attends_batch_kv(self, meta, kv_cache, key) -> bool:
        # A fresh prefill's keys are all this batch's: SDPA reads them where the rotary
        # kernel left them, not gathered back from the cache's blocks. Same dtype only, so
        # that they are exactly what the cache holds.
        return kv_cache.dtype == key.dtype and not meta.is_pure_decode and self._use_sdpa(meta)

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, batch_kv=None) -> torch.Tensor:
        out = torch.empty_like(query)
        # Padding rows belong to no request; zero them so no garbage (NaN) flows onwards.
        if meta.num_actual_tokens < out.shape[0]:
            out[meta.num_actual_tokens:].zero_()
        if meta.num_reqs == 0 or meta.num_actual_tokens == 0:
            return out
        if meta.is_pure_decode:
            self._decode(query, kv_cache, meta, scale, out)
        elif self._use_sdpa(meta):
            self._sdpa_prefill(query, kv_cache, meta, scale, out, batch_kv)
        else:
            block_m, block_n, warps = self._prefill_tiles(query.shape[2], query.dtype)
            paged_prefill(query, kv_cache, out, meta.block_table, meta.query_start_loc,
                          meta.seq_lens, meta.num_reqs, meta.max_query_len, scale,
                          block_m=block_m, block_n=block_n, num_warps=warps)
        return out

    def _decode(self, query, kv_cache, meta, scale, out) -> None:
        # About 16 KB of keys per tile: wide keys (fp32, head dim 256) take fewer per tile.
        key_bytes = query.shape[2] * query.element_size()
        block_n = self.tiles.decode_block_n or max(16, min(64, 16384 // key_bytes))
        splits = self.tiles.num_splits or default_num_splits(
            meta.num_reqs, kv_cache.shape[3], meta.max_seq_len, block_n)
        paged_decode(query, kv_cache, out, meta.block_table, meta.query_start_loc,
                     meta.seq_lens, meta.num_reqs, scale, splits, block_n=block_n)

    def _prefill_tiles(self, head_dim: int, dtype: torch.dtype) -> tuple[int, int, int]:
        # Sized so that ptxas reports no spills for sm_90 (checked by compiling offline):
        # head dim 256 halves the tile; fp32 inputs take exact FMA dots, far hungrier.
        if dtype == torch.float32:
            block_m, block_n = (16 if head_dim > 128 else 32), 16
        else:
            block_m, block_n = (64, 32) if head_dim > 128 else (128, 64)
        block_m = self.tiles.prefill_block_m or block_m
        block_n = self.tiles.prefill_block_n or block_n
        return block_m, block_n, 8 if block_m >= 128 else 4

    def _use_sdpa(self, meta: AttentionMetadata) -> bool:
        """A fresh prefill: every request's query is its whole sequence (host-side check)."""
        if meta.num_reqs > self.tiles.sdpa_max_reqs or \
                meta.num_actual_tokens < self.sdpa_min_tokens:
            return False
        return meta.is_fresh_prefill

    def _sdpa_prefill(self, query, kv_cache, meta, scale, out, batch_kv=None) -> None:
        starts, seq_lens = meta.host_bounds
        for i in range(meta.num_reqs):
            q = query[starts[i]:starts[i + 1]]
            if batch_kv is not None:  # a fresh prefill: the request's keys are its rows
                k, v = (t[starts[i]:starts[i + 1]] for t in batch_kv)
            else:
                k, v = gather_kv(kv_cache, meta.block_table[i], seq_lens[i], kv_cache.shape[2])
            # 4-D [1, heads, seq, dim]: the flash kernels take only batched inputs; 3-D falls
            # back to the math kernel, which materialises the whole score matrix.
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k.transpose(0, 1).to(q.dtype)[None],
                v.transpose(0, 1).to(q.dtype)[None], is_causal=True, scale=scale,
                enable_gqa=True)[0]
            out[starts[i]:starts[i + 1]] = o.transpose(0, 1)
