"""Attention over the paged KV cache: a varlen causal kernel for prefill and mixed batches,
and split-K flash-decoding for pure decode.

Both kernels put all query heads of one GQA group in the rows of one tile, so each KV tile
is loaded once per KV head rather than once per query head. Keys are gathered per key
through the block table, which lets the key tile (BLOCK_N) differ from the cache block size.
Softmax runs online in fp32 in the log2 domain (the scale is pre-multiplied by log2(e)).

Both take an optional int32 device tensor of request indices (`req_index`): program i along
the grid's first axis then serves request req_index[i], so a mixed batch can send its
decodes to the split-K kernels and its prompt chunks to the varlen kernel, each launched over
only its own requests. Without it (the HAS_REQ_INDEX constexpr off) program i serves request i
and the kernels compile as they did before the flag existed.

Cache layout per layer: `[2, num_blocks, block_size, num_kv_heads, head_dim]`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from loom.kernels import pdl
from loom.kernels.kv_write import check_slot_layout, saturation, to_cache
from loom.kernels.rope_kv_write import check_qk_norm, rms_scale

_LOG2E = 1.4426950408889634
# tl.dot needs at least 16 rows; decode pads its GQA group up to this.
_MIN_DOT_ROWS = 16


@triton.jit
def _attend_tile(q, acc, m_i, l_i, start, kv_end, q_pos, block_row_ptr, k_base, v_base,
                 stride_cblk, stride_cslot, scale_log2,
                 CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, FULL: tl.constexpr = False):
    """One step of online softmax over keys [start, start + BLOCK_N). FULL: every key of
    the tile exists and every row sees it (no masks; CAUSAL is then ignored)."""
    k_pos = start + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    # Block-table indirection per key: BLOCK_N may span several cache blocks.
    if FULL:
        blk = tl.load(block_row_ptr + k_pos // BLOCK_SIZE)
    else:
        k_ok = k_pos < kv_end
        blk = tl.load(block_row_ptr + k_pos // BLOCK_SIZE, mask=k_ok, other=0)
    off = blk.to(tl.int64) * stride_cblk + (k_pos % BLOCK_SIZE) * stride_cslot
    k_ptrs = k_base + off[None, :] + dims[:, None]
    if FULL:
        k = tl.load(k_ptrs)
    else:
        k = tl.load(k_ptrs, mask=k_ok[None, :], other=0.0)
    s = tl.dot(q, k.to(q.dtype), input_precision=PRECISION) * scale_log2
    if not FULL:
        visible = k_ok[None, :]
        if CAUSAL:
            visible = visible & (k_pos[None, :] <= q_pos[:, None])
        # Every row sees key 0 (prefill) or the split's first key (decode) in its first
        # tile, so m_new is finite from then on and exp2(-inf - m_new) is a clean 0.
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v_ptrs = v_base + off[:, None] + dims[None, :]
    if FULL:
        v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=k_ok[:, None], other=0.0)
    acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc * alpha[:, None], input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def _dot_dtype(q, F16_DOT: tl.constexpr):
    """q as the dots take it. F16_DOT (an 8-bit cache beside 16-bit queries): fp16, clamped
    to its range, and `_attend_tile` then converts keys, values and probabilities to fp16
    too. An 8-bit key becomes fp16 in one instruction per pair, bf16 in a further one per
    element; fp16 also holds an 8-bit value and a probability more exactly than bf16."""
    if F16_DOT:
        q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
    return q


# Integers that change from step to step are not specialised on (Triton would compile a
# variant per divisibility by 16 and per value 1, each costing a serving request a stall).
@triton.jit(do_not_specialize=["stride_bt"])
def _prefill_kernel(
    q_ptr, cache_ptr, out_ptr, block_table_ptr, query_start_ptr, seq_lens_ptr, req_index_ptr,
    scale_log2, stride_qt, stride_qh, stride_ot, stride_oh,
    stride_plane, stride_cblk, stride_cslot, stride_chead, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, HAS_REQ_INDEX: tl.constexpr, MASK_ALL: tl.constexpr = False,
    F16_DOT: tl.constexpr = False,
):
    # grid: (request, query tile, kv head). Rows are BLOCK_Q tokens x GROUP_PAD heads.
    req = tl.program_id(0)
    if HAS_REQ_INDEX:  # the launch covers a subset of the batch's requests
        req = tl.load(req_index_ptr + req)
    q_tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(query_start_ptr + req)
    q_len = tl.load(query_start_ptr + req + 1) - q_start
    if q_tile * BLOCK_Q >= q_len:  # the grid is sized by the longest request launched
        return
    seq_len = tl.load(seq_lens_ptr + req)
    ctx_len = seq_len - q_len  # tokens already cached before this step's queries

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    tok = q_tile * BLOCK_Q + rows // GROUP_PAD
    g = rows % GROUP_PAD
    head = kv_head * GROUP + g
    row_ok = (tok < q_len) & (g < GROUP)
    dims = tl.arange(0, HEAD_DIM)
    q_off = (q_start + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh
    q = _dot_dtype(tl.load(q_ptr + q_off + dims[None, :], mask=row_ok[:, None], other=0.0),
                   F16_DOT)
    q_pos = ctx_len + tok

    # Keys past this tile's last query are masked for every row: stop there.
    kv_end = tl.minimum(seq_len, ctx_len + (q_tile + 1) * BLOCK_Q)
    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_DIM], tl.float32)
    block_row_ptr = block_table_ptr + req.to(tl.int64) * stride_bt
    k_base = cache_ptr + kv_head * stride_chead
    # Keys before the tile's first query are seen by every row: whole tiles of them take
    # no masks. The rest (the diagonal, and a partial last tile) are masked. MASK_ALL: mask
    # every tile (the kernel as it was before the split; kept to compare).
    full_end = 0
    if not MASK_ALL:
        full_end = (ctx_len + q_tile * BLOCK_Q) // BLOCK_N * BLOCK_N
    for start in range(0, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start, kv_end, q_pos, block_row_ptr, k_base,
            k_base + stride_plane, stride_cblk, stride_cslot, scale_log2,
            False, HEAD_DIM, BLOCK_SIZE, BLOCK_N, PRECISION, True)
    for start in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start, kv_end, q_pos, block_row_ptr, k_base,
            k_base + stride_plane, stride_cblk, stride_cslot, scale_log2,
            True, HEAD_DIM, BLOCK_SIZE, BLOCK_N, PRECISION)
    out = acc / l_i[:, None]
    o_off = (q_start + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh
    tl.store(out_ptr + o_off + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])


@triton.jit
def _rotate_half(x_ptr, offs, dims, ok, cos_sin_row, norm_ptr, norm_eps,
                 HEAD_DIM: tl.constexpr, NORM: tl.constexpr):
    """Rotary (rotate-half) of the rows at x_ptr + offs [R, HEAD_DIM] at one position, as
    rope_kv_write computes it: float32 products and sums, rounded to the input's dtype.
    Element d pairs with d + D/2 (or d - D/2): x * cos - partner * sin below the half,
    x * cos + partner * sin above it. NORM: each row is first RMS-normalised with the
    weights at norm_ptr (a per-head q/k norm), as rope_kv_write does it."""
    half: tl.constexpr = HEAD_DIM // 2
    low = dims < half
    freq = tl.where(low, dims, dims - half)
    cos = tl.load(cos_sin_row + freq)[None, :]
    sin = tl.load(cos_sin_row + half + freq)[None, :]
    sign = tl.where(low, -1.0, 1.0)[None, :]
    x = tl.load(x_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    partner = tl.where(low, dims + half, dims - half)
    xp = tl.load(x_ptr + offs - dims[None, :] + partner[None, :], mask=ok,
                 other=0.0).to(tl.float32)
    if NORM:
        elem = x_ptr.dtype.element_ty
        rstd = tl.math.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + norm_eps)[:, None]
        every = tl.full([1, HEAD_DIM], 1, tl.int1)
        x = rms_scale(x, rstd, norm_ptr, dims[None, :], every, elem)
        xp = rms_scale(xp, rstd, norm_ptr, partner[None, :], every, elem)
    return (x * cos + (sign * xp) * sin).to(x_ptr.dtype.element_ty)


@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _decode_split_kernel(
    q_ptr, cache_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
    block_table_ptr, query_start_ptr, seq_lens_ptr, req_index_ptr,
    k_ptr, v_ptr, positions_ptr, cos_sin_ptr, slot_mapping_ptr, q_norm_ptr, k_norm_ptr,
    norm_eps, scale_log2, num_heads,
    num_splits, stride_qt, stride_qh, stride_ot, stride_oh, stride_kt, stride_kh, stride_vt,
    stride_vh, stride_pos, stride_plane, stride_cblk, stride_cslot, stride_chead, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, HAS_REQ_INDEX: tl.constexpr, DIRECT: tl.constexpr,
    ROPE: tl.constexpr, SAT: tl.constexpr = 0.0, F16_DOT: tl.constexpr = False,
    PDL: tl.constexpr = False, QK_NORM: tl.constexpr = False,
):
    # grid: (request, kv head, split). Each split covers a BLOCK_N-aligned slice of this
    # request's own length, so the grid does not depend on sequence lengths (graph-safe).
    # The partials are indexed by the program (`slot`), the batch's tensors by the request.
    # DIRECT (one split): the program holds the whole softmax and writes the output itself.
    # ROPE: q, k and v come unrotated and unwritten (no rope_kv_write launch before): every
    # program rotates its q heads, and the one whose split holds the new token rotates its
    # key and stores key and value into the cache before attending. QK_NORM (with ROPE):
    # q and k are RMS-normalised per head first (Qwen3's q_norm / k_norm).
    if PDL:  # launched early (loom/kernels/pdl.py): every input is a predecessor's output
        pdl.wait_then_release()
    slot = tl.program_id(0)
    req = slot
    if HAS_REQ_INDEX:
        req = tl.load(req_index_ptr + slot)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_ptr + req)
    if tl.load(query_start_ptr + req + 1) == q_start:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    split_len = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    lo = split * split_len
    hi = tl.minimum(seq_len, lo + split_len)

    g = tl.arange(0, GROUP_PAD)
    head = kv_head * GROUP + g
    g_ok = g < GROUP
    dims = tl.arange(0, HEAD_DIM)
    q_off = q_start.to(tl.int64) * stride_qt + head[:, None] * stride_qh + dims[None, :]
    k_base = cache_ptr + kv_head * stride_chead
    if ROPE:
        cos_sin_row = cos_sin_ptr + tl.load(positions_ptr + q_start).to(tl.int64) * stride_pos
        q = _rotate_half(q_ptr, q_off, dims, g_ok[:, None], cos_sin_row, q_norm_ptr, norm_eps,
                         HEAD_DIM, QK_NORM)
        new_slot = tl.load(slot_mapping_ptr + q_start)
        if (lo <= seq_len - 1) & (seq_len - 1 < hi) & (new_slot >= 0):
            row = q_start.to(tl.int64)
            one = tl.full([1], 1, tl.int1)
            key = _rotate_half(k_ptr, (row * stride_kt + kv_head * stride_kh + dims)[None, :],
                               dims, one[:, None], cos_sin_row, k_norm_ptr, norm_eps,
                               HEAD_DIM, QK_NORM)
            value = tl.load(v_ptr + row * stride_vt + kv_head * stride_vh + dims)
            dst = k_base + new_slot.to(tl.int64) * stride_cslot + dims
            elem = cache_ptr.dtype.element_ty
            tl.store(dst[None, :], to_cache(key, elem, SAT))
            tl.store(dst + stride_plane, to_cache(value, elem, SAT))
            tl.debug_barrier()  # the stores are visible to this program's loads below
    else:
        q = tl.load(q_ptr + q_off, mask=g_ok[:, None], other=0.0)
    q = _dot_dtype(q, F16_DOT)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    block_row_ptr = block_table_ptr + req.to(tl.int64) * stride_bt
    # An empty split (lo >= hi) leaves m=-inf, l=0, acc=0, which the reduce weighs as 0.
    for start in range(lo, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, start, hi, m_i, block_row_ptr, k_base,
            k_base + stride_plane, stride_cblk, stride_cslot, scale_log2,
            False, HEAD_DIM, BLOCK_SIZE, BLOCK_N, PRECISION)
    if DIRECT:
        o_off = q_start.to(tl.int64) * stride_ot + head[:, None] * stride_oh + dims[None, :]
        out = acc / l_i[:, None]
        tl.store(out_ptr + o_off, out.to(out_ptr.dtype.element_ty), mask=g_ok[:, None])
    else:
        part = (slot.to(tl.int64) * num_heads + head) * num_splits + split
        tl.store(part_m_ptr + part, m_i, mask=g_ok)
        tl.store(part_l_ptr + part, l_i, mask=g_ok)
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc,
                 mask=g_ok[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, query_start_ptr, req_index_ptr, num_heads,
    num_splits, stride_ot, stride_oh, SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    HAS_REQ_INDEX: tl.constexpr, PDL: tl.constexpr = False,
):
    # grid: (request, query head). Rescale each split to the global max, then normalise.
    if PDL:
        pdl.wait_then_release()
    slot = tl.program_id(0)
    req = slot
    if HAS_REQ_INDEX:
        req = tl.load(req_index_ptr + slot)
    head = tl.program_id(1)
    q_start = tl.load(query_start_ptr + req)
    if tl.load(query_start_ptr + req + 1) == q_start:
        return
    s = tl.arange(0, SPLITS_PAD)
    s_ok = s < num_splits
    part = (slot.to(tl.int64) * num_heads + head) * num_splits + s
    m = tl.load(part_m_ptr + part, mask=s_ok, other=float("-inf"))
    l = tl.load(part_l_ptr + part, mask=s_ok, other=0.0)
    dims = tl.arange(0, HEAD_DIM)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :],
                  mask=s_ok[:, None], other=0.0)
    w = tl.exp2(m - tl.max(m, axis=0))  # split 0 is never empty, so the max is finite
    out = tl.sum(acc * w[:, None], axis=0) / tl.sum(l * w, axis=0)
    o_off = q_start.to(tl.int64) * stride_ot + head * stride_oh
    tl.store(out_ptr + o_off + dims, out.to(out_ptr.dtype.element_ty))


def _check(query: torch.Tensor, kv_cache: torch.Tensor) -> tuple[int, int]:
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = kv_cache.shape[3]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
        raise ValueError(f"head_dim {head_dim} must be a power of two in 16..256")
    if query.stride(2) != 1 or kv_cache.stride(4) != 1:
        raise ValueError("query and kv_cache need a contiguous head dim")
    return num_heads // num_kv_heads, num_kv_heads


def _f16_dot(query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the dots run in fp16 (`_dot_dtype`): an 8-bit cache and 16-bit queries."""
    return kv_cache.element_size() == 1 and query.element_size() == 2


def _precision(dtype: torch.dtype) -> str:
    # fp32 inputs would silently drop to tf32 on tensor cores; keep them exact.
    return "ieee" if dtype == torch.float32 else "tf32"


def _cache_strides(kv_cache: torch.Tensor) -> tuple[int, int, int, int]:
    return kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3)


def _check_req_index(req_index: torch.Tensor | None, num_reqs: int) -> None:
    if req_index is None:
        return
    if req_index.dtype != torch.int32 or req_index.dim() != 1 or \
            req_index.shape[0] != num_reqs:
        raise ValueError(f"req_index must be int32 [num_reqs={num_reqs}], got "
                         f"{req_index.dtype} {tuple(req_index.shape)}")


def paged_prefill(query: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor,
                  block_table: torch.Tensor, query_start_loc: torch.Tensor,
                  seq_lens: torch.Tensor, num_reqs: int, max_query_len: int, scale: float,
                  block_m: int = 64, block_n: int = 64, num_warps: int = 4,
                  num_stages: int = 2, req_index: torch.Tensor | None = None,
                  mask_all: bool = False) -> torch.Tensor:
    """Causal varlen attention of query [T, H, D] over the paged cache into out [T, H, D].

    block_m is the tile's row count (query tokens x padded GQA group); block_n its keys.
    Rows of out that belong to no request launched are left untouched. req_index: int32
    [num_reqs] on the device, the batch's requests to attend for (block_table, query_start_loc
    and seq_lens stay the whole batch's); then max_query_len need only cover those.
    Key tiles wholly before a query tile's first token take no masks; mask_all masks every
    tile, as the kernel did before (for comparing the two).
    """
    group, num_kv_heads = _check(query, kv_cache)
    _check_req_index(req_index, num_reqs)
    group_pad = triton.next_power_of_2(group)
    block_q = max(1, block_m // group_pad)
    block_q = max(block_q, triton.cdiv(_MIN_DOT_ROWS, group_pad))
    grid = (num_reqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _prefill_kernel[grid](
        query, kv_cache, out, block_table, query_start_loc, seq_lens, req_index,
        scale * _LOG2E, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        *_cache_strides(kv_cache), block_table.stride(0),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=query.shape[2],
        BLOCK_SIZE=kv_cache.shape[2], BLOCK_Q=block_q, BLOCK_N=block_n,
        PRECISION=_precision(query.dtype), HAS_REQ_INDEX=req_index is not None,
        MASK_ALL=mask_all, F16_DOT=_f16_dot(query, kv_cache), num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def default_num_splits(num_reqs: int, num_kv_heads: int, max_seq_len: int, block_n: int,
                       target_programs: int = 264, max_splits: int = 32) -> int:
    """Enough splits to fill the GPU (about 2 programs per SM of an H200) but none that
    would be empty for the longest request."""
    want = triton.cdiv(target_programs, max(1, num_reqs * num_kv_heads))
    return max(1, min(want, max_splits, triton.cdiv(max(1, max_seq_len), block_n)))


class NewTokens(NamedTuple):
    """A decode step's new tokens, for paged_decode to rotate and cache itself: key and
    value [T, Hkv, D] (unrotated, head dim contiguous), positions [T], the float32
    cos_sin_cache [max_pos, D] of loom.layers.rotary, slot_mapping [T] (< 0: not stored);
    qk_norm: (q_weight, k_weight, eps) of a per-head norm before rotary
    (`loom.layers.norm.QKNorm`), or None."""

    key: torch.Tensor
    value: torch.Tensor
    positions: torch.Tensor
    cos_sin_cache: torch.Tensor
    slot_mapping: torch.Tensor
    qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None


def paged_decode(query: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor,
                 block_table: torch.Tensor, query_start_loc: torch.Tensor,
                 seq_lens: torch.Tensor, num_reqs: int, scale: float, num_splits: int,
                 block_n: int = 64, num_warps: int = 4, num_stages: int = 2,
                 req_index: torch.Tensor | None = None,
                 new_tokens: NewTokens | None = None) -> torch.Tensor:
    """Split-K flash-decoding: one query token per request, attending to all its keys.

    The grid depends on (num_reqs, num_kv_heads, num_splits) only; pass a fixed num_splits
    when capturing CUDA graphs. A second kernel merges the splits' partials; with one split
    there are none, and the split kernel writes out itself (one launch a layer). req_index:
    int32 [num_reqs] on the device, the batch's requests to decode (each must have a query of
    one token or none); out gets each one's row at its query_start_loc.

    new_tokens: query and the new keys come unrotated and the new keys and values are not
    in the cache yet; the kernel rotates and stores them as rope_write_kv_cache would (the
    same arithmetic, a per-head q/k norm first where new_tokens has one), saving that
    launch. Not with req_index.
    """
    group, num_kv_heads = _check(query, kv_cache)
    _check_req_index(req_index, num_reqs)
    num_heads, head_dim = query.shape[1], query.shape[2]
    rope = new_tokens is not None
    if rope:
        key, value, positions, cos_sin_cache, slot_mapping, qk_norm = new_tokens
        if req_index is not None:
            raise ValueError("paged_decode: new_tokens with req_index is not supported")
        check_slot_layout(kv_cache, "paged_decode")
        if key.stride(2) != 1 or value.stride(2) != 1 or cos_sin_cache.stride(1) != 1 \
                or cos_sin_cache.dtype != torch.float32 or cos_sin_cache.shape[1] != head_dim:
            raise ValueError("paged_decode: new_tokens need contiguous head dims and a float32 "
                             f"[max_pos, {head_dim}] cos_sin_cache")
    else:  # never read (ROPE off): any tensors of the right kind
        key = value = query
        positions = slot_mapping = query_start_loc
        cos_sin_cache = query
        qk_norm = None
    q_norm, k_norm, norm_eps = check_qk_norm(qk_norm, query, key, "paged_decode")
    direct = num_splits == 1
    use_pdl = pdl.enabled(query.device)
    if direct:  # no partials: the pointers are never read
        part_m = part_l = part_acc = out
    else:
        part_m = torch.empty(num_reqs, num_heads, num_splits, dtype=torch.float32,
                             device=query.device)
        part_l = torch.empty_like(part_m)
        part_acc = torch.empty(num_reqs, num_heads, num_splits, head_dim, dtype=torch.float32,
                               device=query.device)
    _decode_split_kernel[(num_reqs, num_kv_heads, num_splits)](
        query, kv_cache, part_m, part_l, part_acc, out, block_table, query_start_loc,
        seq_lens, req_index, key, value, positions, cos_sin_cache, slot_mapping, q_norm, k_norm,
        norm_eps, scale * _LOG2E, num_heads, num_splits, query.stride(0), query.stride(1),
        out.stride(0), out.stride(1), key.stride(0), key.stride(1), value.stride(0),
        value.stride(1), cos_sin_cache.stride(0), *_cache_strides(kv_cache),
        block_table.stride(0), GROUP=group,
        GROUP_PAD=max(_MIN_DOT_ROWS, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=kv_cache.shape[2], BLOCK_N=block_n, PRECISION=_precision(query.dtype),
        HAS_REQ_INDEX=req_index is not None, DIRECT=direct, ROPE=rope,
        SAT=saturation(kv_cache) if rope else 0.0, F16_DOT=_f16_dot(query, kv_cache),
        PDL=use_pdl, QK_NORM=qk_norm is not None,
        num_warps=num_warps, num_stages=num_stages, launch_pdl=use_pdl,
    )
    if direct:
        return out
    _decode_reduce_kernel[(num_reqs, num_heads)](
        part_m, part_l, part_acc, out, query_start_loc, req_index, num_heads, num_splits,
        out.stride(0), out.stride(1), SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim, HAS_REQ_INDEX=req_index is not None, PDL=use_pdl,
        launch_pdl=use_pdl,
    )
    return out
