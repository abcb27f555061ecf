"""Attention over the paged KV cache: a varlen causal kernel for prefill and mixed batches
here, and split-K flash-decoding for pure decode in `paged_decode.py`, which shares this
module's tile step and checks.

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

import torch
import triton
import triton.language as tl

from loom.kernels.host import cdiv, next_power_of_2
from loom.kernels.launch import fast_launch


LOG2E = 1.4426950408889634
# tl.dot needs at least 16 rows; decode pads its GQA group up to this.
MIN_DOT_ROWS = 16


@triton.jit
def tanh(x):
    """tanh through exp2 (libdevice's is not in Triton's interpreter); from |x|, so that
    exp2 never overflows."""
    t = tl.exp2(-2.8853900817779268 * tl.abs(x))  # exp(-2|x|)
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


@triton.jit
def softmax_step(s, m_i, l_i, EMPTY_ROWS: tl.constexpr):
    """Online softmax over one tile's scores s (log2 units, -inf where masked): the
    probabilities, the old rows' rescale factor, the new running max and sum. EMPTY_ROWS:
    a row may have seen no key yet (a window), and its -inf scores must give 0, not NaN."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_ref = m_new
    if EMPTY_ROWS:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def attend_tile(q, acc, m_i, l_i, start, kv_end, q_pos, block_row_ptr, k_base, v_base,
                 stride_cblk, stride_cslot, scale_log2, window, cap_log2,
                 CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                 BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, FULL: tl.constexpr = False,
                 WINDOW: tl.constexpr = False, SOFTCAP: tl.constexpr = False,
                 EMPTY_ROWS: tl.constexpr = False):
    """One step of online softmax over keys [start, start + BLOCK_N). FULL: every key of
    the tile exists and every row sees it (no masks; CAUSAL and WINDOW are then ignored).
    WINDOW (with CAUSAL): row r sees only keys after q_pos[r] - window, so a row may see
    none of a tile, or of all tiles so far. EMPTY_ROWS: so may a row without a window (a
    split of keys after its causal limit). SOFTCAP: scores are softcapped, scale_log2
    then being scale / softcap and cap_log2 softcap * log2(e) (`score_args`)."""
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
    if SOFTCAP:
        s = tanh(s) * cap_log2
    if not FULL:
        visible = k_ok[None, :]
        if CAUSAL:
            visible = visible & (k_pos[None, :] <= q_pos[:, None])
            if WINDOW:
                visible = visible & (k_pos[None, :] > q_pos[:, None] - window)
        # Without a window every row sees key 0 (prefill) or the split's first key (decode)
        # in its first tile, so m_new is finite from then on and exp2(-inf - m_new) is a
        # clean 0.
        s = tl.where(visible, s, float("-inf"))
    if WINDOW:
        p, alpha, m_new, l_i = softmax_step(s, m_i, l_i, True)
    else:
        p, alpha, m_new, l_i = softmax_step(s, m_i, l_i, EMPTY_ROWS)
    v_ptrs = v_base + off[:, None] + dims[None, :]
    if FULL:
        v = tl.load(v_ptrs)
    else:
        v = tl.load(v_ptrs, mask=k_ok[:, None], other=0.0)
    acc = tl.dot(p.to(q.dtype), v.to(q.dtype), acc * alpha[:, None], input_precision=PRECISION)
    return acc, m_new, l_i


@triton.jit
def dot_dtype(q, F16_DOT: tl.constexpr):
    """q as the dots take it. F16_DOT (an 8-bit cache beside 16-bit queries): fp16, clamped
    to its range, and `attend_tile` then converts keys, values and probabilities to fp16
    too. An 8-bit key becomes fp16 in one instruction per pair, bf16 in a further one per
    element; fp16 also holds an 8-bit value and a probability more exactly than bf16."""
    if F16_DOT:
        q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
    return q


@triton.jit
def packed_tile(tile_start_ptr, num_reqs, SEARCH_STEPS: tl.constexpr):
    """(request, query tile) of this program on a packed grid's first axis, where request i
    owns the slots from tile_start[i] (`packed_tile_starts`): the last request starting at
    or before the slot, by binary search (SEARCH_STEPS >= log2(num_reqs) rounds)."""
    slot = tl.program_id(0)
    lo = slot * 0
    hi = lo + num_reqs
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        right = tl.load(tile_start_ptr + mid) <= slot
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid)
    return lo, slot - tl.load(tile_start_ptr + lo)


@triton.jit
def tile_bounds(first_q, last_q, window, BLOCK_N: tl.constexpr, MASK_ALL: tl.constexpr,
                WINDOW: tl.constexpr):
    """(kv_start, full_start, full_end): a query tile of positions first_q..last_q reads
    key tiles from kv_start, masked up to full_start, whole (every row sees every key)
    up to full_end, masked again from there. Without WINDOW the first masked run is
    empty: every row sees keys 0..first_q. With it, keys before first_q - window + 1 are
    seen by no row (skipped), and only keys from last_q - window + 1 by every row."""
    kv_start = first_q * 0
    full_end = kv_start
    if not MASK_ALL:
        full_end = first_q // BLOCK_N * BLOCK_N
    full_start = kv_start
    if WINDOW:
        kv_start = tl.maximum(first_q - window + 1, 0) // BLOCK_N * BLOCK_N
        full_end = tl.maximum(full_end, kv_start)
        full_start = tl.minimum(
            tl.cdiv(tl.maximum(last_q - window + 1, 0), BLOCK_N) * BLOCK_N, full_end)
        full_start = tl.maximum(full_start, kv_start)
    return kv_start, full_start, full_end


# Integers that change from step to step are not specialised on (Triton would compile a
# variant per divisibility by 16 and per value 1, each costing a serving request a stall).
@triton.jit(do_not_specialize=["stride_bt", "window"])
def _prefill_kernel(
    q_ptr, cache_ptr, out_ptr, block_table_ptr, query_start_ptr, seq_lens_ptr, req_index_ptr,
    scale_log2, window, cap_log2, stride_qt, stride_qh, stride_ot, stride_oh,
    stride_plane, stride_cblk, stride_cslot, stride_chead, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, HAS_REQ_INDEX: tl.constexpr, MASK_ALL: tl.constexpr = False,
    F16_DOT: tl.constexpr = False, tile_start_ptr=None, num_reqs=0,
    SEARCH_STEPS: tl.constexpr = 0, WINDOW: tl.constexpr = False,
    SOFTCAP: tl.constexpr = False,
):
    # grid: (request, query tile, kv head). Rows are BLOCK_Q tokens x GROUP_PAD heads.
    kv_head = tl.program_id(2)
    if SEARCH_STEPS:  # packed: (slot, 1, kv head) over num_reqs requests
        if tl.program_id(0) >= tl.load(tile_start_ptr + num_reqs):
            return  # past the batch's tiles: one load, no search
        req, q_tile = packed_tile(tile_start_ptr, num_reqs, SEARCH_STEPS)
    else:
        req = tl.program_id(0)
        if HAS_REQ_INDEX:  # the launch covers a subset of the batch's requests
            req = tl.load(req_index_ptr + req)
        q_tile = tl.program_id(1)
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
    q = dot_dtype(tl.load(q_ptr + q_off + dims[None, :], mask=row_ok[:, None], other=0.0),
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
    # every tile (the kernel as it was before the split; kept to compare). WINDOW: tiles
    # wholly before the first row's window are skipped, and the keys that the last row's
    # window leaves out are masked too (`tile_bounds`).
    kv_start, full_start, full_end = tile_bounds(ctx_len + q_tile * BLOCK_Q, kv_end - 1,
                                                 window, BLOCK_N, MASK_ALL, WINDOW)
    for start in range(kv_start, full_start, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            q, acc, m_i, l_i, start, kv_end, q_pos, block_row_ptr, k_base,
            k_base + stride_plane, stride_cblk, stride_cslot, scale_log2, window, cap_log2,
            True, HEAD_DIM, BLOCK_SIZE, BLOCK_N, PRECISION, False, WINDOW, SOFTCAP)
    for start in range(full_start, full_end, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            q, acc, m_i, l_i, start, kv_end, q_pos, block_row_ptr, k_base,
            k_base + stride_plane, stride_cblk, stride_cslot, scale_log2, window, cap_log2,
            False, HEAD_DIM, BLOCK_SIZE, BLOCK_N, PRECISION, True, False, SOFTCAP)
    for start in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = attend_tile(
            q, acc, m_i, l_i, start, kv_end, q_pos, block_row_ptr, k_base,
            k_base + stride_plane, stride_cblk, stride_cslot, scale_log2, window, cap_log2,
            True, HEAD_DIM, BLOCK_SIZE, BLOCK_N, PRECISION, False, WINDOW, SOFTCAP)
    out = acc / l_i[:, None]
    o_off = (q_start + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh
    tl.store(out_ptr + o_off + dims[None, :], out.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None])


def check_heads(query: torch.Tensor, kv_cache: torch.Tensor) -> tuple[int, int]:
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = kv_cache.shape[3]
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
        raise ValueError(f"head_dim {head_dim} must be a power of two in 16..256")
    if query.stride(2) != 1 or kv_cache.stride(4) != 1:
        raise ValueError("query and kv_cache need a contiguous head dim")
    return num_heads // num_kv_heads, num_kv_heads


def f16_dot(query: torch.Tensor, kv_cache: torch.Tensor) -> bool:
    """Whether the dots run in fp16 (`dot_dtype`): an 8-bit cache and 16-bit queries."""
    return kv_cache.element_size() == 1 and query.element_size() == 2


def precision(dtype: torch.dtype) -> str:
    # fp32 inputs would silently drop to tf32 on tensor cores; keep them exact.
    return "ieee" if dtype == torch.float32 else "tf32"


def cache_strides(kv_cache: torch.Tensor) -> tuple[int, int, int, int]:
    return kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3)


def score_args(scale: float, window: int | None,
               softcap: float | None) -> tuple[tuple[float, int, float], dict]:
    """The kernels' score arguments: (scale_log2, window, cap_log2), softmax running in the
    log2 domain, and their constexpr switches {WINDOW, SOFTCAP}. Softcapped, s * scale becomes
    tanh(s * scale / cap) * cap, in log2 units tanh(s * scale_log2) * cap_log2 with
    scale_log2 = scale / cap and cap_log2 = cap * log2(e)."""
    if window is not None and window < 1:
        raise ValueError(f"sliding window {window}: must be a positive number of keys")
    if softcap is not None and softcap <= 0:
        raise ValueError(f"softcap {softcap}: must be positive")
    runtime = (scale / softcap if softcap else scale * LOG2E, window or 0,
               softcap * LOG2E if softcap else 0.0)
    return runtime, dict(WINDOW=window is not None, SOFTCAP=softcap is not None)


def check_req_index(req_index: torch.Tensor | None, num_reqs: int) -> None:
    if req_index is None:
        return
    if req_index.dtype != torch.int32 or req_index.dim() != 1 or \
            req_index.shape[0] != num_reqs:
        raise ValueError(f"req_index must be int32 [num_reqs={num_reqs}], got "
                         f"{req_index.dtype} {tuple(req_index.shape)}")


def prefill_block_q(block_m: int, group: int) -> int:
    """Query tokens a prefill tile holds: block_m rows over the GQA group padded to a power
    of two, at least enough tokens for a dot's MIN_DOT_ROWS."""
    group_pad = next_power_of_2(group)
    return max(block_m // group_pad, cdiv(MIN_DOT_ROWS, group_pad), 1)


def packed_tile_starts(query_start_loc: torch.Tensor, block_q: int) -> torch.Tensor:
    """int32 [num_reqs + 1] on the device: each request's first slot on a packed grid (the
    query tiles of block_q tokens of the requests before it), then the total. Computed on
    the device, so a CUDA graph recomputes it from each batch's query_start_loc."""
    tiles = (query_start_loc[1:] - query_start_loc[:-1] + block_q - 1) // block_q
    starts = torch.zeros_like(query_start_loc)
    torch.cumsum(tiles, 0, out=starts[1:])
    return starts


def paged_prefill(query: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor,
                  block_table: torch.Tensor, query_start_loc: torch.Tensor,
                  seq_lens: torch.Tensor, num_reqs: int, max_query_len: int, scale: float,
                  block_m: int = 64, block_n: int = 64, num_warps: int = 4,
                  num_stages: int = 2, req_index: torch.Tensor | None = None,
                  mask_all: bool = False, packed_tokens: int | None = None,
                  tile_starts: torch.Tensor | None = None, window: int | None = None,
                  softcap: float | None = None) -> torch.Tensor:
    """Causal varlen attention of query [T, H, D] over the paged cache into out [T, H, D].

    block_m is the tile's row count (query tokens x padded GQA group); block_n its keys.
    Rows of out that belong to no request launched are left untouched. req_index: int32
    [num_reqs] on the device, the batch's requests to attend for (block_table, query_start_loc
    and seq_lens stay the whole batch's); then max_query_len need only cover those.
    Key tiles wholly before a query tile's first token take no masks; mask_all masks every
    tile, as the kernel did before (for comparing the two).
    packed_tokens: the grid is packed (`packed_tile`), for at most this many query tokens
    over num_reqs requests of any lengths: what a CUDA graph captures once for every batch
    it replays (requests past the batch's have empty queries). max_query_len is then unused;
    a grid sized by it would be num_reqs x packed_tokens / block_q programs. tile_starts:
    `packed_tile_starts` of this launch's block_q (`prefill_block_q`), made once for a step's
    layers; computed here where not given. window, softcap: `ScoreOpts`' (a query tile
    reads no key tile wholly before its first query's window).
    """
    group, num_kv_heads = check_heads(query, kv_cache)
    check_req_index(req_index, num_reqs)
    group_pad = next_power_of_2(group)
    block_q = prefill_block_q(block_m, group)
    if packed_tokens is not None:
        if req_index is not None:
            raise ValueError("paged_prefill: a packed grid covers the whole batch; req_index "
                             "must be None")
        if tile_starts is None:
            tile_starts = packed_tile_starts(query_start_loc[:num_reqs + 1], block_q)
        # sum of cdiv(q_len, block_q) <= tokens / block_q + one partial tile a request
        grid = (packed_tokens // block_q + num_reqs, 1, num_kv_heads)
        packed = dict(tile_start_ptr=tile_starts, num_reqs=num_reqs,
                      SEARCH_STEPS=max(1, num_reqs.bit_length()))
    else:
        grid, packed = (num_reqs, cdiv(max_query_len, block_q), num_kv_heads), {}
    scores, switches = score_args(scale, window, softcap)
    fast_launch(_prefill_kernel, grid)(
        query, kv_cache, out, block_table, query_start_loc, seq_lens, req_index,
        *scores, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        *cache_strides(kv_cache), block_table.stride(0),
        GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=query.shape[2],
        BLOCK_SIZE=kv_cache.shape[2], BLOCK_Q=block_q, BLOCK_N=block_n,
        PRECISION=precision(query.dtype), HAS_REQ_INDEX=req_index is not None,
        MASK_ALL=mask_all, F16_DOT=f16_dot(query, kv_cache), num_warps=num_warps,
        num_stages=num_stages, **packed, **switches,
    )
    return out
