"""The GPU attention backend: Triton kernels over the paged KV cache.

Pure decode steps take the split-K flash-decoding kernel; prefill steps take the varlen
paged kernel. A mixed step splits its requests by query length: those of one token go to the
split-K decode kernels and the rest to the varlen kernel, each launched over only its own
requests through a device list of request indices (built once per step from the host-side
bounds). Run whole through the varlen kernel, a decode took a tile of BLOCK_Q query tokens
with one real, and the grid was sized by the longest prompt chunk for every request.
A pure prefill of few requests with no cached context and enough tokens takes PyTorch's SDPA
instead (cuDNN's flash attention beats a generic Triton tile on long prompts), reading each
request's keys where the rotary kernel left them (gathered from the cache where it holds 8-bit
keys); not in layers with a sliding window or a score softcap, which SDPA's causal kernels do
not apply: those take the varlen kernel, which skips the key tiles before a window.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import torch

from loom import envs
from loom.attention.backend import PLAIN, AttentionBackend, AttentionMetadata, ScoreOpts
from loom.attention.mixed_split import (MixedSplit, by_kind, short_query_tokens,
                                        split_by_query_len, splits_mixed)
from loom.attention.sdpa import SDPA_BUCKET, sdpa_causal
from loom.attention.torch_native import gather_kv
from loom.kernels.compile_pool import compile_pool
from loom.kernels.host import round_up
from loom.kernels.kv_write import write_kv_cache
from loom.kernels.paged_attention import packed_tile_starts, paged_prefill, prefill_block_q
from loom.kernels.paged_decode import NewTokens, default_num_splits, paged_decode
from loom.kernels.rope_kv_write import rope_write_kv_cache

logger = logging.getLogger(__name__)

WIDE_DECODE_PROGRAMS = 64
"""(request, KV head) programs of a decode batch over an 8-bit cache from which it takes
its 2-warp tiles (`TritonBackend.decode_tiles`)."""

WIDE_8BIT_SPLIT_PROGRAMS = 1024
WIDE_8BIT_MAX_SPLITS = 8
"""A decode in 2-warp tiles over an 8-bit cache is split toward WIDE_8BIT_SPLIT_PROGRAMS
programs (request x KV head x split) in at most WIDE_8BIT_MAX_SPLITS splits
(`TritonBackend.decode_splits`); others aim at SPLIT_PROGRAMS in up to 32."""


class DecodeTiles(NamedTuple):
    """The split-K decode kernel's tiles (`TritonBackend.decode_tiles`)."""

    block_n: int
    num_warps: int
    num_stages: int


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
    """...and of at least this many tokens (None: LOOM_SDPA_MIN_TOKENS, default
    envs.SDPA_MIN_TOKENS). Below, the paged kernel's one launch beats SDPA's host work."""


class TritonBackend(AttentionBackend):
    name = "triton"
    fuses_rope = True

    def __init__(self, tiles: TritonTiles | None = None) -> None:
        self.tiles = tiles or TritonTiles()
        self.sdpa_min_tokens = (self.tiles.sdpa_min_tokens
                                if self.tiles.sdpa_min_tokens is not None
                                else envs.sdpa_min_tokens())
        self.mixed_split_min_decodes = envs.mixed_split_min_decodes()
        # read once: decode_tiles and decode_splits run at every decode layer
        forced = envs.decode_tiles()
        self.forced_decode_tiles = None if forced is None else DecodeTiles(*forced)
        self.forced_decode_splits = envs.decode_splits()
        if forced is not None or self.forced_decode_splits is not None:
            logger.info("every decode takes %s%s (LOOM_DECODE_TILES / LOOM_DECODE_SPLITS)",
                        "the backend's tiles" if forced is None else
                        "%d-key tiles on %d warps, %d stages" % forced,
                        "" if self.forced_decode_splits is None
                        else f", {self.forced_decode_splits} splits")
        self.mixed_split_min_context = envs.mixed_split_min_context()
        self._split_of: tuple[weakref.ref, MixedSplit | None] | None = None
        """The last step's metadata (weakly) and its split: every layer reads it again."""
        self._tile_starts_of: tuple[weakref.ref, torch.Tensor] | None = None
        """The same for a fixed-shape step's packed tile starts (a graph's forward makes
        its metadata afresh for each run, so its capture records their computation)."""
        self._compile_decodes: list[tuple[int, int, int, int]] = []
        """`compiling_decodes`' variants, until the next pure decode compiles them."""
        self._told_no_sdpa = False
        """Whether the log has said that a layer's ScoreOpts kept a prefill from SDPA."""
        self._short_query_decode = envs.short_query_decode()
        self._fused_rope_off = envs.decode_rope_unfused()
        if self._fused_rope_off:
            logger.info("LOOM_DECODE_ROPE_UNFUSED: decode steps rotate and write the KV cache "
                        "in a kernel of their own")

    def write_kv(self, key, value, kv_cache, slot_mapping):
        write_kv_cache(key, value, kv_cache, slot_mapping[:key.shape[0]])

    def rope_write_kv(self, query, key, value, positions, cos_sin_cache, kv_cache,
                      slot_mapping, kv_out=None, qk_norm=None):
        # One kernel for both (and a q/k norm): at decode each alone is mostly launch and
        # ramp-up.
        return rope_write_kv_cache(query, key, value, positions, cos_sin_cache, kv_cache,
                                   slot_mapping, kv_out=kv_out, qk_norm=qk_norm)

    def attends_batch_kv(self, meta, kv_cache, key, opts: ScoreOpts = PLAIN) -> bool:
        # A fresh prefill's keys are all this batch's: SDPA reads them where the rotary
        # kernel left them, not gathered back from the cache's blocks. Same dtype only, so
        # that they are exactly what the cache holds.
        return (kv_cache.dtype == key.dtype and not meta.is_pure_decode
                and not meta.fixed_shape and self._use_sdpa(meta, opts))

    def decode_rope(self, query, key, value, positions, cos_sin_cache, kv_cache, meta,
                    scale, qk_norm=None, opts: ScoreOpts = PLAIN):
        # The decode kernel rotates q and k and stores k and v itself: one launch a layer
        # fewer than rope_write_kv_cache first (a few microseconds each at decode).
        if self._fused_rope_off:
            return None
        out = self._new_out(query, meta)
        if meta.num_reqs and meta.num_actual_tokens:
            self._decode(query, kv_cache, meta, scale, out, new_tokens=NewTokens(
                key, value, positions, cos_sin_cache, meta.slot_mapping, qk_norm), opts=opts)
        return out

    @staticmethod
    def _new_out(query: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        if meta.fixed_shape and not meta.is_pure_decode:
            # which rows are padding is known on the device only (a decode graph's padding
            # rows are requests of one key)
            return torch.zeros_like(query)
        out = torch.empty_like(query)
        # Padding rows belong to no request; zero them so no garbage (NaN) flows onwards.
        if meta.num_actual_tokens < out.shape[0]:
            out[meta.num_actual_tokens:].zero_()
        return out

    def forward(self, query: torch.Tensor, kv_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float, batch_kv=None, opts: ScoreOpts = PLAIN) -> torch.Tensor:
        out = self._new_out(query, meta)
        if meta.num_reqs == 0 or meta.num_actual_tokens == 0:
            return out
        if meta.fixed_shape and not meta.is_pure_decode:
            # A CUDA graph of any batch up to its bounds: one packed launch serves every
            # request, decodes included.
            self._prefill(query, kv_cache, meta, scale, out, meta.num_reqs,
                          meta.max_query_len, packed=True, opts=opts)
        elif meta.is_pure_decode:
            self._decode(query, kv_cache, meta, scale, out, opts=opts)
        elif self._use_sdpa(meta, opts):
            self._sdpa_prefill(query, kv_cache, meta, scale, out, batch_kv)
        else:
            split = self._split(meta, query.device)
            if split is None:  # one kind only (prompt chunks): one launch, as before
                self._prefill(query, kv_cache, meta, scale, out, meta.num_reqs,
                              meta.max_query_len, opts=opts)
            else:
                self._decode(query, kv_cache, meta, scale, out, len(split.decode_index),
                             split.decode_max_seq_len, split.decode_index, opts=opts)
                self._prefill(query, kv_cache, meta, scale, out, len(split.prefill_index),
                              split.prefill_max_query_len, split.prefill_index, opts=opts)
        return out

    def fits_one_launch(self, meta: AttentionMetadata) -> bool:
        """A fixed-shape graph attends for every request in one packed prefill launch:
        what this backend does anyway for a mixed batch it does not split (few decodes, none
        of a long context). Batches it splits keep their split-K decodes out of graphs."""
        _, decode, _, longest = by_kind(meta)
        return not len(decode) or not self.splits_mixed(len(decode), longest)

    def splits_mixed(self, num_decodes: int, longest: int) -> bool:
        """`splits_mixed` at this backend's thresholds."""
        return splits_mixed(num_decodes, longest, self.mixed_split_min_decodes,
                            self.mixed_split_min_context)

    def _split(self, meta: AttentionMetadata, device: torch.device) -> MixedSplit | None:
        """split_by_query_len, once per step: a step's metadata is built afresh and never
        changed, so the first layer's split (and its upload) serves every layer."""
        if self._split_of is not None and self._split_of[0]() is meta:
            return self._split_of[1]
        split = split_by_query_len(meta, device, self.mixed_split_min_decodes,
                                   self.mixed_split_min_context)
        self._split_of = (weakref.ref(meta), split)
        return split

    def _tile_starts(self, meta: AttentionMetadata, block_q: int) -> torch.Tensor:
        """packed_tile_starts of a fixed-shape step, once: every layer's tiles are alike."""
        if self._tile_starts_of is None or self._tile_starts_of[0]() is not meta:
            self._tile_starts_of = (weakref.ref(meta), packed_tile_starts(
                meta.query_start_loc[:meta.num_reqs + 1], block_q))
        return self._tile_starts_of[1]

    def _prefill(self, query, kv_cache, meta, scale, out, num_reqs, max_query_len,
                 req_index=None, packed=False, opts: ScoreOpts = PLAIN) -> None:
        """Queries of several tokens: the varlen kernel, or where they are all short (a
        verify's, `short_query_tokens`) the split-K decode kernel at q_tokens."""
        q_tokens = self._short_query_decode and short_query_tokens(
            max_query_len, query.shape[1] // kv_cache.shape[3], query.shape[2], opts)
        if q_tokens:
            # A graph's request slots outnumber its requests of max_query_len tokens: split
            # as for those.
            split_reqs = (min(num_reqs, max(1, meta.num_actual_tokens // max_query_len))
                          if meta.fixed_shape else num_reqs)
            self._decode(query, kv_cache, meta, scale, out, num_reqs, meta.max_seq_len,
                         req_index, opts=opts, q_tokens=q_tokens, split_reqs=split_reqs)
            return
        block_m, block_n, warps, stages = self.prefill_tiles(query.shape[2], query.dtype)
        tile_starts = (self._tile_starts(meta, prefill_block_q(
            block_m, query.shape[1] // kv_cache.shape[3])) if packed else None)
        paged_prefill(query, kv_cache, out, meta.block_table, meta.query_start_loc,
                      meta.seq_lens, num_reqs, max_query_len, scale, block_m=block_m,
                      block_n=block_n, num_warps=warps, num_stages=stages,
                      req_index=req_index, packed_tokens=meta.num_actual_tokens if packed
                      else None, tile_starts=tile_starts, window=opts.sliding_window,
                      softcap=opts.softcap)

    def _decode(self, query, kv_cache, meta, scale, out, num_reqs=None, max_seq_len=None,
                req_index=None, new_tokens=None, opts: ScoreOpts = PLAIN,
                q_tokens: int = 1, split_reqs: int | None = None) -> None:
        """All the batch's requests (a pure decode), or those req_index names; new_tokens,
        q_tokens: see paged_decode. split_reqs: the requests the splits are chosen for
        (num_reqs). Queries of several tokens take the narrow batches' 4-warp tiles (their
        rows would crowd 2 warps' registers)."""
        num_reqs = meta.num_reqs if num_reqs is None else num_reqs
        max_seq_len = meta.max_seq_len if max_seq_len is None else max_seq_len
        split_reqs = num_reqs if split_reqs is None else split_reqs
        if opts.sliding_window is not None:  # the splits divide the window's keys only
            max_seq_len = min(max_seq_len, opts.sliding_window)
        tiles = self.decode_tiles(num_reqs if q_tokens == 1 else 1, kv_cache.shape[3],
                                  query.shape[2], query.dtype, kv_cache.dtype)
        splits = self.decode_splits(split_reqs, kv_cache.shape[3], max_seq_len, tiles,
                                    kv_cache.dtype)

        def launch(block_n, num_warps, num_stages, num_splits, compile_only=False):
            paged_decode(query, kv_cache, out, meta.block_table, meta.query_start_loc,
                         meta.seq_lens, num_reqs, scale, num_splits, block_n=block_n,
                         num_warps=num_warps, num_stages=num_stages, req_index=req_index,
                         new_tokens=new_tokens, compile_only=compile_only,
                         window=opts.sliding_window, softcap=opts.softcap, q_tokens=q_tokens)
        if self._compile_decodes and req_index is None and q_tokens == 1:
            variants, self._compile_decodes = self._compile_decodes, []
            with compile_pool(len(variants)):  # side by side, nothing run
                for variant in variants:
                    launch(*variant, compile_only=True)
        launch(*tiles, splits)

    @contextlib.contextmanager
    def compiling_decodes(self, variants: list[tuple[int, int, int, int]]):
        """In the block, the next pure decode first compiles the decode kernel at each of
        variants ((block_n, num_warps, num_stages, num_splits)) with its own arguments
        (rotary fused or not, a q/k norm or not, as the model calls it), side by side on
        threads, running none: start-up's warm-up of decodes outside CUDA graphs."""
        self._compile_decodes = list(variants)
        try:
            yield
        finally:
            self._compile_decodes = []

    def decode_splits(self, num_reqs: int, num_kv_heads: int, max_seq_len: int,
                      tiles: DecodeTiles, cache_dtype: torch.dtype) -> int:
        """Splits per (request, KV head) of a decode batch in `tiles` whose longest context
        (or, in a CUDA graph, the model's length) is max_seq_len. 2-warp tiles over an
        8-bit cache (wide batches, `decode_tiles`), bound by their instructions, aim at
        ~1024 programs in up to 8 splits, not 264 in up to 32 (docs/performance.md,
        session 28). LOOM_DECODE_SPLITS overrides this."""
        if self.forced_decode_splits is not None:
            return self.forced_decode_splits
        if self.tiles.num_splits:
            return self.tiles.num_splits
        if cache_dtype.itemsize == 1 and tiles.num_warps == 2:
            return default_num_splits(num_reqs, num_kv_heads, max_seq_len, tiles.block_n,
                                      target_programs=WIDE_8BIT_SPLIT_PROGRAMS,
                                      max_splits=WIDE_8BIT_MAX_SPLITS)
        return default_num_splits(num_reqs, num_kv_heads, max_seq_len, tiles.block_n)

    def decode_tiles(self, num_reqs: int, num_kv_heads: int, head_dim: int,
                     dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> DecodeTiles:
        """The split-K decode kernel's tiles for queries of `dtype` over a cache of
        `cache_dtype` (None: the same), each choice measured with `loom bench attention
        --tune` and end to end (docs/performance.md, sessions 27 and 28).

        16-bit keys of up to 128 dims: 128 keys a tile, three stages deep, at any batch
        (1.04x at 430 requests x 1280 tokens; 0.81x-0.87x the 64-key two-stage tiles at
        batch 1 and 4 of 4096 and 8192 tokens). Over an 8-bit cache, batches that alone give
        the GPU enough (request, KV head) programs take 64 keys three deep on 2 warps: the
        kernel is bound by its instructions there (fp8 conversions, the GQA group padded to
        16 rows), and half the warps a program let twice the programs share an SM (8B
        throughput's decode-only steps 12.80 against 13.74 s). Narrower ones take 128 keys
        two deep on 4 warps (8B decode at batch 4 after 8192-token prompts: 0.95x).
        Otherwise (fp32, head dim 256) about 16 KB of keys a tile, two stages.
        LOOM_DECODE_TILES overrides all of this (and LOOM_DECODE_SPLITS the splits,
        `decode_splits`)."""
        if self.forced_decode_tiles is not None:
            return self.forced_decode_tiles
        elem = dtype.itemsize
        if self.tiles.decode_block_n:
            return DecodeTiles(self.tiles.decode_block_n, 4, 2)
        # Measured (and compiled offline without spills) for 16-bit queries of up to 128
        # dims.
        if elem == 2 and head_dim <= 128:
            if cache_dtype is None or cache_dtype.itemsize == 2:
                return DecodeTiles(128, 4, 3)
            if num_reqs * num_kv_heads >= WIDE_DECODE_PROGRAMS:
                return DecodeTiles(64, 2, 3)
            return DecodeTiles(128, 4, 2)
        return DecodeTiles(max(16, min(64, 16384 // (head_dim * elem))), 4, 2)

    def prefill_tiles(self, head_dim: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
        """(block_m, block_n, num_warps, num_stages) of the varlen prefill kernel."""
        # 16-bit keys of up to 128 dims: 128 rows x 64 keys, 4 warps, 3 stages, the best
        # or within 0.3% of it for both of throughput's prompt-step shapes in `loom bench
        # attention --mode prefill --tune` on an H200 (16 fresh 1024-token prompts: 1.11x;
        # the same after 1024 cached tokens: 1.24x over 8 warps, 2 stages). Head dim 256
        # halves the tile and fp32 inputs take exact FMA dots, far hungrier: sized so that
        # ptxas reports no spills for sm_90 (compiled offline).
        if dtype == torch.float32:
            block_m, block_n, warps, stages = (16 if head_dim > 128 else 32), 16, 4, 2
        elif head_dim > 128:
            block_m, block_n, warps, stages = 64, 32, 4, 2
        else:
            block_m, block_n, warps, stages = 128, 64, 4, 3
        if self.tiles.prefill_block_m or self.tiles.prefill_block_n:
            block_m = self.tiles.prefill_block_m or block_m
            block_n = self.tiles.prefill_block_n or block_n
            warps, stages = (8 if block_m >= 128 else 4), 2
        return block_m, block_n, warps, stages

    def _use_sdpa(self, meta: AttentionMetadata, opts: ScoreOpts = PLAIN) -> bool:
        """A fresh prefill: every request's query is its whole sequence (host-side check),
        in a layer with neither window nor softcap (SDPA's causal kernels apply neither)."""
        if meta.num_reqs > self.tiles.sdpa_max_reqs or \
                meta.num_actual_tokens < self.sdpa_min_tokens or not meta.is_fresh_prefill:
            return False
        if not opts.plain:
            if not self._told_no_sdpa:
                self._told_no_sdpa = True
                logger.info("fresh prefills in layers with a sliding window or attention "
                            "softcap take the paged kernel, not SDPA (%s)", opts)
            return False
        return True

    def _sdpa_prefill(self, query, kv_cache, meta, scale, out, batch_kv=None) -> None:
        starts, seq_lens = meta.host_bounds
        for i in range(meta.num_reqs):
            q = query[starts[i]:starts[i + 1]]
            if batch_kv is not None:  # a fresh prefill: the request's keys are its rows
                k, v = (t[starts[i]:starts[i + 1]] for t in batch_kv)
            else:
                k, v = gather_kv(kv_cache, meta.block_table[i], seq_lens[i], kv_cache.shape[2])
            out[starts[i]:starts[i + 1]] = sdpa_causal(q, k, v, scale)

    def warm_up_sdpa(self, num_heads: int, num_kv_heads: int, head_dim: int,
                     dtype: torch.dtype, device: torch.device, scale: float,
                     max_tokens: int) -> list[int]:
        """Run SDPA once at every padded length a request of up to max_tokens can take
        (none where SDPA is off), so that cuDNN builds its graphs before serving; the
        lengths run."""
        if not self.tiles.sdpa_max_reqs or max_tokens < max(self.sdpa_min_tokens, 1):
            return []
        lengths = list(range(SDPA_BUCKET, round_up(max_tokens, SDPA_BUCKET) + 1, SDPA_BUCKET))
        for n in lengths:
            q = torch.zeros(n, num_heads, head_dim, dtype=dtype, device=device)
            kv = torch.zeros(n, num_kv_heads, head_dim, dtype=dtype, device=device)
            sdpa_causal(q, kv, kv, scale)
        return lengths
