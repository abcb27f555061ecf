"""Split-K flash-decoding over the paged KV cache (one query token per request, or a
speculative verify's few), the decode half of `paged_attention.py`: one kernel over
(request, KV head, split) that can also rotate, normalise and cache the step's new tokens
itself, and merges its splits itself.

The merge is a "fixup", as the GEMV's (`gemv.py`, split_mode "fixup"): each split stores its
float32 partials (running max, sum and output of its GROUP query heads), bumps its (request,
KV head)'s arrival counter (`arrival.py`), and the last of the request's active splits to
arrive rescales them all to the global max, writes the output and puts the counter back to
0. So a decode attention is one launch a layer, where a second kernel used to merge (at
batch 1 on an H200 it took 2.1 us plus ~1 us idle between the two, beside the split
kernel's 6.0 us). Splits run over each request's own length, so a short request has fewer
active splits than the grid's: the empty ones exit at once, and a request with one active
split writes its output directly, as a launch of one split does.

The merge is the launch's tail, in one program per (request, KV head) reading GROUP x
n_active x HEAD_DIM floats, where the reduce kernel spread them over num_heads programs.
Measured alone on an H200 (32 query heads, bf16, a 256 MB copy before each call so the
cache comes from HBM; one call against split + reduce): at 8 KV heads, batch 1, 128 /
512 / 2048 / 8192 keys, +0.4 / -0.7 / +0.2 / 0.0 us; batch 4, -0.7 / -0.8 / -0.5 / -0.2;
at 4 KV heads (groups of 8), batch 1, -0.75 / -0.2 / +1.65 / +1.55 us, the merge of 32
splits of 8 heads (128 KB) costing more than the second launch did.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from loom.kernels import arrival, pdl
from loom.kernels.compile_pool import launch_or_compile
from loom.kernels.host import cdiv, next_power_of_2
from loom.kernels.kv_write import check_slot_layout, saturation, to_cache
from loom.kernels.paged_attention import (MIN_DOT_ROWS, attend_tile, cache_strides,
                                          check_heads, check_req_index, dot_dtype, f16_dot,
                                          precision, score_args)
from loom.kernels.rope_kv_write import check_qk_norm, rotate_half_rows


@triton.jit
def _store_normalised(out_ptr, o_off, acc, l_i, ok):
    """One program's whole softmax: its output acc / l, rows where ok."""
    tl.store(out_ptr + o_off, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=ok)


@triton.constexpr_function
def _next_power_of_2(n):
    return triton.next_power_of_2(n)


@triton.jit
def _merge_splits(part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, o_row, first_part,
                  n_active, num_splits, stride_oh, first_head, GROUP: tl.constexpr,
                  SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr):
    """The output of GROUP query heads from the partials of their n_active splits, as the
    separate reduce kernel computed it: each split rescaled to the heads' global max with
    exp2, summed, divided by the weighted sum of l. The partials were stored by other
    programs: loaded .cg, from L2, never a stale L1 line.

    It runs after every split of the (request, KV head), so its time is the launch's tail,
    and it keeps clear of cross-thread reductions (their shared-memory round trips and
    barriers kept the compiler from overlapping the loads): one pass takes each head's max
    over the splits, a second the weighted sums, each split's rows a [G_P2, HEAD_DIM] tile
    whose columns each thread owns (4 values a thread for 4 heads of 128 dims at 4 warps),
    both unrolled over SPLITS_PAD (splits from n_active on are masked: no memory traffic);
    no addresses depend on loaded values. Timed on an H200 at batch 1 (32 query and 8 KV
    heads, 4096 keys, 32 splits, back to back in a CUDA graph): a loop over the heads with
    [SPLITS_PAD, HEAD_DIM] loads and tl.max / tl.sum over the splits took 14.3 us a call,
    this form 10.0, the split and reduce kernels 9.5; the second pass as a pipelined
    tl.range over n_active (cp.async, 4 or 8 stages) was slower, as were 3-D chunked loads
    (Triton spread the split axis over threads)."""
    G_P2: tl.constexpr = _next_power_of_2(GROUP)
    g = tl.arange(0, G_P2)
    g_ok = g < GROUP
    dims = tl.arange(0, HEAD_DIM)
    rows = first_part + g * num_splits  # split 0's partial of each head
    top = tl.full([G_P2], float("-inf"), tl.float32)
    for i in tl.static_range(SPLITS_PAD):
        ok = g_ok & (i < n_active)
        top = tl.maximum(top, tl.load(part_m_ptr + rows + i, mask=ok, other=float("-inf"),
                                      cache_modifier=".cg"))
    top = tl.where(g_ok, top, 0.0)  # split 0 is never empty: finite for every real head
    total = tl.where(g_ok, 0.0, 1.0)  # padding rows: 0 / 1, never stored
    acc = tl.zeros([G_P2, HEAD_DIM], tl.float32)
    for i in tl.static_range(SPLITS_PAD):
        ok = g_ok & (i < n_active)
        w = tl.exp2(tl.load(part_m_ptr + rows + i, mask=ok, other=float("-inf"),
                            cache_modifier=".cg") - top)
        total += tl.load(part_l_ptr + rows + i, mask=ok, other=0.0, cache_modifier=".cg") * w
        acc += tl.load(part_acc_ptr + (rows + i)[:, None] * HEAD_DIM + dims[None, :],
                       mask=ok[:, None], other=0.0, cache_modifier=".cg") * w[:, None]
    tl.store(out_ptr + o_row + (first_head + g)[:, None] * stride_oh + dims[None, :],
             (acc / total[:, None]).to(out_ptr.dtype.element_ty), mask=g_ok[:, None])


@triton.jit(do_not_specialize=["num_splits", "stride_bt", "window"])
def _decode_split_kernel(
    q_ptr, cache_ptr, part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, count_ptr,
    block_table_ptr, query_start_ptr, seq_lens_ptr, req_index_ptr,
    k_ptr, v_ptr, positions_ptr, cos_sin_ptr, slot_mapping_ptr, q_norm_ptr, k_norm_ptr,
    norm_eps, scale_log2, window, cap_log2, num_heads, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_pos, stride_plane, stride_cblk, stride_cslot, stride_chead, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, HAS_REQ_INDEX: tl.constexpr, DIRECT: tl.constexpr,
    ROPE: tl.constexpr, SAT: tl.constexpr = 0.0, F16_DOT: tl.constexpr = False,
    PDL: tl.constexpr = False, QK_NORM: tl.constexpr = False, SPLITS_PAD: tl.constexpr = 1,
    WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False, Q_TOKENS: tl.constexpr = 1,
):
    # grid: (request, kv head, split). Each split covers a slice (a multiple of BLOCK_N
    # keys) of this request's own keys, so the grid does not depend on sequence lengths
    # (graph-safe); the request's n_active = cdiv(its keys, split_len) first splits hold
    # keys, the rest exit at once. The partials and arrival counters are indexed by the
    # program (`slot`), the batch's tensors by the request.
    # DIRECT (one split), or one active split: the program holds the whole softmax and
    # writes the output itself. Otherwise each active split stores its partials and bumps
    # the (slot, kv head) counter; the last to arrive merges them (SPLITS_PAD: num_splits'
    # next power of two) and puts the counter back to 0 for the next launch or graph replay.
    # ROPE: q, k and v come unrotated and unwritten (no rope_kv_write launch before): every
    # program rotates its q heads, and the one whose split holds the new token rotates its
    # key and stores key and value into the cache before attending. QK_NORM (with ROPE):
    # q and k are RMS-normalised per head first (Qwen3's q_norm / k_norm). WINDOW: the
    # query sees only the last `window` keys; the splits divide those alone, so every key
    # a split reads is seen (no mask) and no program reads the keys before them.
    # Q_TOKENS > 1: a request's query is up to Q_TOKENS tokens (a speculative step's
    # verify), the rows of a tile its tokens x the GQA group (GROUP_PAD rows in all), each
    # token seeing the keys up to its own position; a split may then hold keys after some
    # rows' last, so those rows see none of it (m = -inf, l = 0: weight 0 in the merge).
    MULTI: tl.constexpr = Q_TOKENS > 1
    if PDL:  # launched early (loom/kernels/pdl.py): every input is a predecessor's output
        pdl.wait_then_release()
    slot = tl.program_id(0)
    req = slot
    if HAS_REQ_INDEX:
        req = tl.load(req_index_ptr + slot)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    q_start = tl.load(query_start_ptr + req)
    q_len = tl.load(query_start_ptr + req + 1) - q_start
    if q_len == 0:
        return
    seq_len = tl.load(seq_lens_ptr + req)
    first_key = seq_len * 0
    if WINDOW:
        first_key = tl.maximum(seq_len - window, 0)
    split_len = tl.cdiv(tl.cdiv(seq_len - first_key, num_splits), BLOCK_N) * BLOCK_N
    lo = first_key + split * split_len
    hi = tl.minimum(seq_len, lo + split_len)
    if lo >= hi:  # past the request's keys: no partials, no arrival (not one of n_active)
        return

    dims = tl.arange(0, HEAD_DIM)
    o_row = q_start.to(tl.int64) * stride_ot
    if MULTI:
        G_P2: tl.constexpr = _next_power_of_2(GROUP)
        r = tl.arange(0, GROUP_PAD)
        tok = r // G_P2
        g = r % G_P2
        g_ok = (g < GROUP) & (tok < q_len)
        q_row = ((q_start + tok).to(tl.int64) * stride_qt)[:, None]
        o_rows = ((q_start + tok).to(tl.int64) * stride_ot)[:, None]
    else:
        g = tl.arange(0, GROUP_PAD)
        tok = 0
        g_ok = g < GROUP
        q_row = q_start.to(tl.int64) * stride_qt
        o_rows = o_row
    head = kv_head * GROUP + g
    q_off = q_row + head[:, None] * stride_qh + dims[None, :]
    k_base = cache_ptr + kv_head * stride_chead
    if ROPE:
        cos_sin_row = cos_sin_ptr + tl.load(positions_ptr + q_start).to(tl.int64) * stride_pos
        q = rotate_half_rows(q_ptr, q_off, dims, g_ok[:, None], cos_sin_row, q_norm_ptr,
                             norm_eps, HEAD_DIM, QK_NORM)
        new_slot = tl.load(slot_mapping_ptr + q_start)
        if (lo <= seq_len - 1) & (seq_len - 1 < hi) & (new_slot >= 0):
            row = q_start.to(tl.int64)
            one = tl.full([1], 1, tl.int1)
            key = rotate_half_rows(k_ptr, (row * stride_kt + kv_head * stride_kh + dims)[None, :],
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
    q = dot_dtype(q, F16_DOT)

    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    block_row_ptr = block_table_ptr + req.to(tl.int64) * stride_bt
    q_pos = m_i  # unread by a one-token query (not CAUSAL)
    if MULTI:
        q_pos = seq_len - q_len + tok
    for start in range(lo, hi, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            q, acc, m_i, l_i, start, hi, q_pos, block_row_ptr, k_base,
            k_base + stride_plane, stride_cblk, stride_cslot, scale_log2, window, cap_log2,
            MULTI, HEAD_DIM, BLOCK_SIZE, BLOCK_N, PRECISION, False, False, SOFTCAP, MULTI)
    o_off = o_rows + head[:, None] * stride_oh + dims[None, :]
    if DIRECT:
        _store_normalised(out_ptr, o_off, acc, l_i, g_ok[:, None])
    else:
        # the same in every program of the request
        n_active = tl.cdiv(seq_len - first_key, split_len)
        if n_active == 1:
            _store_normalised(out_ptr, o_off, acc, l_i, g_ok[:, None])
        else:
            first_part = (slot.to(tl.int64) * Q_TOKENS * num_heads + kv_head * GROUP) * \
                num_splits
            part = first_part + (tok * num_heads + g) * num_splits + split
            tl.store(part_m_ptr + part, m_i, mask=g_ok)
            tl.store(part_l_ptr + part, l_i, mask=g_ok)
            tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc,
                     mask=g_ok[:, None])
            # CUTLASS's semaphore, as gemv's fixup: every thread's partials are stored
            # before the barrier, and the counter's release (one thread) is ordered after.
            tl.debug_barrier()
            count = count_ptr + slot * tl.num_programs(1) + kv_head
            arrived = tl.atomic_add(count, 1, sem="acq_rel")
            if arrived == n_active - 1:
                if MULTI:  # token by token: all its rows at once crowd the registers
                    for t in range(tl.minimum(q_len, Q_TOKENS)):  # (no partials past it)
                        _merge_splits(part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr,
                                      o_row + t * stride_ot,
                                      first_part + t * num_heads * num_splits, n_active,
                                      num_splits, stride_oh, kv_head * GROUP, GROUP,
                                      SPLITS_PAD, HEAD_DIM)
                else:
                    _merge_splits(part_m_ptr, part_l_ptr, part_acc_ptr, out_ptr, o_row,
                                  first_part, n_active, num_splits, stride_oh,
                                  kv_head * GROUP, GROUP, SPLITS_PAD, HEAD_DIM)
                tl.store(count, 0)  # ready for the next launch (or graph replay)


SPLIT_PROGRAMS = 264
"""The programs (request x KV head x split) default_num_splits aims at: 2 an H200 SM."""


def default_num_splits(num_reqs: int, num_kv_heads: int, max_seq_len: int, block_n: int,
                       target_programs: int = SPLIT_PROGRAMS, max_splits: int = 32) -> int:
    """Enough splits to fill the GPU (about 2 programs per SM of an H200) but none that
    would be empty for the longest request."""
    want = cdiv(target_programs, max(1, num_reqs * num_kv_heads))
    return max(1, min(want, max_splits, cdiv(max(1, max_seq_len), block_n)))


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


def _new_token_args(new_tokens: NewTokens | None, query: torch.Tensor, kv_cache: torch.Tensor,
                    query_start_loc: torch.Tensor) -> NewTokens:
    """new_tokens, checked; without them (ROPE off) placeholders the kernel never reads."""
    if new_tokens is None:
        return NewTokens(query, query, query_start_loc, query, query_start_loc, None)
    key, value, _, cos_sin_cache, _, _ = new_tokens
    head_dim = query.shape[2]
    check_slot_layout(kv_cache, "paged_decode")
    if key.stride(2) != 1 or value.stride(2) != 1 or cos_sin_cache.stride(1) != 1 \
            or cos_sin_cache.dtype != torch.float32 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError("paged_decode: new_tokens need contiguous head dims and a float32 "
                         f"[max_pos, {head_dim}] cos_sin_cache")
    return new_tokens


def _partials(query: torch.Tensor, out: torch.Tensor, num_reqs: int,
              num_splits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The splits' running max, sum and output for the merge; with one split there are
    none (the kernel writes out itself) and the pointers are never read."""
    if num_splits == 1:
        return out, out, out
    num_heads, head_dim = query.shape[1], query.shape[2]
    part_m = torch.empty(num_reqs, num_heads, num_splits, dtype=torch.float32,
                         device=query.device)
    part_acc = torch.empty(num_reqs, num_heads, num_splits, head_dim, dtype=torch.float32,
                           device=query.device)
    return part_m, torch.empty_like(part_m), part_acc


def paged_decode(query: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor,
                 block_table: torch.Tensor, query_start_loc: torch.Tensor,
                 seq_lens: torch.Tensor, num_reqs: int, scale: float, num_splits: int,
                 block_n: int = 64, num_warps: int = 4, num_stages: int = 2,
                 req_index: torch.Tensor | None = None,
                 new_tokens: NewTokens | None = None, compile_only: bool = False,
                 window: int | None = None, softcap: float | None = None,
                 q_tokens: int = 1) -> torch.Tensor:
    """Split-K flash-decoding: one query token per request (up to q_tokens, below),
    attending to all its keys.

    The grid depends on (num_reqs, num_kv_heads, num_splits) only; pass a fixed num_splits
    when capturing CUDA graphs. One launch a layer: the last split of a (request, KV head)
    to finish merges its splits' partials (a request whose context fills one split writes
    its output directly). With num_splits > 1 that takes the "paged_decode" arrival
    counters (`loom/kernels/arrival.py`), which the first such call on a device allocates:
    it must not be inside a CUDA graph capture (loom's warm-up and the graph runner's two
    eager runs of each batch size before capturing it make them), and two such launches must
    not run at once on different streams. req_index: int32 [num_reqs] on the device, the
    batch's requests to decode (each must have a query of one token or none); out gets each
    one's row at its query_start_loc.

    new_tokens: query and the new keys come unrotated and the new keys and values are not
    in the cache yet; the kernel rotates and stores them as rope_write_kv_cache would (the
    same arithmetic, a per-head q/k norm first where new_tokens has one), saving that
    launch. Not with req_index.

    compile_only: compile the kernel these arguments need and run nothing (inside
    compile_pool, on its threads). window, softcap: `ScoreOpts`' (the splits then divide
    the window's keys, not the whole context).

    q_tokens (a power of two): queries of up to this many tokens, each attending causally
    (a speculative step's verify: the varlen kernel gives such a query one program per KV
    head, reading every key alone; here the splits share them). Neither with new_tokens
    nor with a window.
    """
    group, num_kv_heads = check_heads(query, kv_cache)
    check_req_index(req_index, num_reqs)
    num_heads, head_dim = query.shape[1], query.shape[2]
    rope = new_tokens is not None
    if rope and req_index is not None:
        raise ValueError("paged_decode: new_tokens with req_index is not supported")
    if q_tokens < 1 or q_tokens & (q_tokens - 1):
        raise ValueError(f"paged_decode: q_tokens {q_tokens} must be a power of two")
    if q_tokens > 1 and (rope or window is not None):
        raise ValueError("paged_decode: queries of several tokens take neither new_tokens "
                         "nor a window")
    key, value, positions, cos_sin_cache, slot_mapping, qk_norm = _new_token_args(
        new_tokens, query, kv_cache, query_start_loc)
    q_norm, k_norm, norm_eps = check_qk_norm(qk_norm, query, key, "paged_decode")
    direct = num_splits == 1
    use_pdl = pdl.enabled(query.device)
    part_m, part_l, part_acc = _partials(query, out, num_reqs * q_tokens, num_splits)
    # One split needs no counters: an int32 placeholder keeps the argument's type.
    counters = seq_lens if direct else arrival.counters(query.device, num_reqs * num_kv_heads,
                                                        "paged_decode")
    scores, switches = score_args(scale, window, softcap)
    launch_or_compile(_decode_split_kernel, (num_reqs, num_kv_heads, num_splits), compile_only)(
        query, kv_cache, part_m, part_l, part_acc, out, counters, block_table, query_start_loc,
        seq_lens, req_index, key, value, positions, cos_sin_cache, slot_mapping, q_norm, k_norm,
        norm_eps, *scores, num_heads, num_splits, query.stride(0), query.stride(1),
        out.stride(0), out.stride(1), key.stride(0), key.stride(1), value.stride(0),
        value.stride(1), cos_sin_cache.stride(0), *cache_strides(kv_cache),
        block_table.stride(0), GROUP=group,
        GROUP_PAD=max(MIN_DOT_ROWS, q_tokens * next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=kv_cache.shape[2], BLOCK_N=block_n, PRECISION=precision(query.dtype),
        HAS_REQ_INDEX=req_index is not None, DIRECT=direct, ROPE=rope,
        SAT=saturation(kv_cache) if rope else 0.0, F16_DOT=f16_dot(query, kv_cache),
        PDL=use_pdl, QK_NORM=qk_norm is not None,
        SPLITS_PAD=1 if direct else next_power_of_2(num_splits),
        Q_TOKENS=q_tokens, num_warps=num_warps, num_stages=num_stages, launch_pdl=use_pdl,
        **switches,
    )
    return out
