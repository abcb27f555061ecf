"""The fused MoE for a handful of tokens (decode at batch 1-2): two GEMV kernels.

With one token and top-8 routing, fused_moe's grouped GEMM pads each of 8 experts' single
row to a 16-row tile, launches 96 programs (fewer than the H200's 132 SMs) and adds four
launches around them (moe_align's two fills and two kernels, the sum over top-k): the call
took 43 us against the 18 us its weights take to read (run_zy). Here each slot (token, k)
reads its expert's rows directly through topk_ids, so nothing is sorted:

  1. gate_up: program (slot, row block) streams BLOCK_N gate rows and the matching up rows
     of w13[expert] along K = hidden and writes silu(gate) * up for the slot;
  2. down: program (token, row block) streams BLOCK_N rows of w2[expert] for each of the
     token's top_k slots in turn, each slot's activation scaled by its routing weight, and
     writes the sum: the per-slot rows and the sum over top-k never reach memory.

Each K chunk is multiplied on the CUDA cores in float32 (a GEMV does two flops per weight
byte pair; tensor cores would only pad the row to 16). An expert that several of a batch's
slots share is read once per slot, so past a few tokens the grouped GEMM, which reads each
expert once, wins: the tuned table (`loom bench moe --tune`) says where.

fp8 experts (loom/kernels/moe_quant.py) are read as fp8 and widened to float32 in
registers: half the bytes a decode step streams. A scale per row multiplies a row's sum
once, after its K loop (in down, once per slot, since each slot has its own expert); block
scales multiply each block column's share of a chunk, so a chunk may span several blocks.
int4 experts are read as BLOCK_K / 8 int32 words a row per chunk (an eighth of bf16's
bytes) and processed part by part, each part within one group, in the words' own layout
(int4_gemv's method): each value the float 128 + q (one prmt on CUDA, else a shift and a
lop3), times the activations of its column (split by value position in registers), the
products summed per word; less (128 + z) times the activations' sum; times the group's
scale. Those per-word sums stay in each thread's registers until the K loop ends (in
down, through every slot), so no chunk waits on a cross-thread sum. A part is the chunk,
or where the chunk is wider than the largest power of two dividing the group, that power
of two. 8-bit integer experts (QUANT 4) likewise, as BLOCK_K / 4 words a row per chunk (a
half of bf16's bytes). Offline sm_90 SASS puts the loop at ~5-11 instructions a value
against ~23-29 for the former unpack-and-reduce form (session 46; unmeasured on a GPU
then: benchmarks/gpu/run_zzz113.sh).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels.host import cdiv
from loom.kernels.int4_gemv import EXPONENT_128, _value
from loom.kernels.int4_linear import _x_slabs
from loom.kernels.moe_quant import ExpertQuant, WeightQuant


@triton.jit
def _chunk_sums(w, a, s_ptrs, QUANT: tl.constexpr, BLOCK_N: tl.constexpr,
                K_PARTS: tl.constexpr, k0, GROUP_K: tl.constexpr, K_GROUPS: tl.constexpr,
                stride_sk):
    """Row sums of w * a over one K chunk [BLOCK_N, BLOCK_K] that starts at k0, in float32
    (bf16 / fp8 weights). Per block (QUANT 2), each of the chunk's K_PARTS parts (one, or
    one per block column when the chunk is wider than a block) times its rows' scale:
    s_ptrs points at each row's first block column. Other scalings are applied by the
    caller."""
    if QUANT < 2:
        return tl.sum(w.to(tl.float32) * a[None, :], axis=1)
    PART: tl.constexpr = w.shape[1] // K_PARTS
    kb = (k0 + tl.arange(0, K_PARTS) * PART) // GROUP_K
    s = tl.load(s_ptrs[:, None] + kb[None, :] * stride_sk, mask=(kb < K_GROUPS)[None, :],
                other=0.0)
    prod = w.to(tl.float32) * a[None, :]
    parts = tl.sum(tl.reshape(prod, [BLOCK_N, K_PARTS, PART]), axis=2)
    return tl.sum(parts * s.to(tl.float32), axis=1)


@triton.jit
def _int_slabs(a, K_PARTS: tl.constexpr, BLOCK_K: tl.constexpr, PACK: tl.constexpr):
    """An activation chunk [BLOCK_K] (float32) as its PACK slabs [K_PARTS, WPP] (slab v:
    value v of each word's columns) and their sum over v."""
    WPP: tl.constexpr = BLOCK_K // K_PARTS // PACK
    xs = _x_slabs(tl.reshape(a, [K_PARTS, WPP, PACK]), K_PARTS, WPP, PACK)
    xsum = xs[0]
    for v in tl.static_range(1, PACK):
        xsum += xs[v]
    return xs, xsum


@triton.jit
def _int_chunk(w, xs, xsum, s_ptrs, z_ptrs, k0, QUANT: tl.constexpr, BLOCK_N: tl.constexpr,
               K_PARTS: tl.constexpr, GROUP_K: tl.constexpr, K_GROUPS: tl.constexpr,
               HAS_ZERO: tl.constexpr, stride_sk, exponent, CONV: tl.constexpr):
    """One K chunk of int4 (QUANT 3) or 8-bit (QUANT 4) words w [BLOCK_N, BLOCK_K / PACK]
    against the activations' slabs (`_int_slabs`), as float32 per row, part and word: the
    caller sums them once, after its loop. Each part lies within one group: its values as
    the floats 128 + q u (int4_gemv's `_value`), their products summed, less (128 + z u)
    times the sum of the activations, over u, times the group's scale (z_ptrs: zero points
    at the scale's strides; none: 8, or 128). exponent: float32 128.0's bits, a runtime
    value so that the shift path's mask and or fold into one lop3."""
    BITS: tl.constexpr = 4 if QUANT == 3 else 8
    PACK: tl.constexpr = 32 // BITS
    WPP: tl.constexpr = w.shape[1] // K_PARTS
    UNIT: tl.constexpr = 1.0 if BITS == 4 else 0.5
    CV: tl.constexpr = CONV if BITS == 4 else 0
    words = tl.reshape(w, [BLOCK_N, K_PARTS, WPP]).to(tl.uint32, bitcast=True)
    lo = words & 0x0F0F0F0F  # prmt's sources (CV 1; unused, so dropped, else)
    hi = (words >> 4) & 0x0F0F0F0F
    p = tl.zeros([BLOCK_N, K_PARTS, WPP], tl.float32)
    for v in tl.static_range(PACK):
        p += _value(words, lo, hi, exponent, v, BITS, CV) * xs[v][None, :, :]
    kb = (k0 + tl.arange(0, K_PARTS) * (WPP * PACK)) // GROUP_K
    kb_ok = (kb < K_GROUPS)[None, :]
    s = tl.load(s_ptrs[:, None] + kb[None, :] * stride_sk, mask=kb_ok, other=0.0)
    if HAS_ZERO:
        z = tl.load(z_ptrs[:, None] + kb[None, :] * stride_sk, mask=kb_ok,
                    other=0).to(tl.float32)
    else:
        z = tl.full([BLOCK_N, K_PARTS], 1 << (BITS - 1), tl.float32)
    c = (128.0 + z * UNIT)[:, :, None]
    return (p - c * xsum[None, :, :]) * (s.to(tl.float32) / UNIT)[:, :, None]


@triton.jit
def _gate_up_gemv_kernel(x_ptr, w13_ptr, inter_ptr, ids_ptr, stride_we, s_ptr, stride_se,
                         stride_sn, stride_sk, z_ptr, exponent, TOP_K: tl.constexpr,
                         HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, QUANT: tl.constexpr,
                         GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, K_PARTS: tl.constexpr,
                         HAS_ZERO: tl.constexpr, CONV: tl.constexpr = 0):
    # QUANT: 0 unquantized, 1 an fp8 scale per row, 2 per block, 3 int4 (4: 8-bit integers)
    # with a scale (and zero point, z_ptr) per group (s_ptr: loom/kernels/moe_quant.py);
    # CONV 1: int4 values by prmt (CUDA; int4_gemv's `_value`)
    slot = tl.program_id(0)
    token = (slot // TOP_K).to(tl.int64)
    expert = tl.load(ids_ptr + slot).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    # Clamped, not masked: the loads stay unpredicated; only the store is masked.
    rows_ld = tl.minimum(rows, INTER - 1)
    # packed integers: eight columns a word (int4), four (8-bit)
    PACK: tl.constexpr = 8 if QUANT == 3 else 4 if QUANT == 4 else 1
    ks = tl.arange(0, BLOCK_K)
    kw = tl.arange(0, BLOCK_K // PACK)
    w_ptrs = (w13_ptr + expert * stride_we + rows_ld.to(tl.int64)[:, None] * (HIDDEN // PACK)
              + kw[None, :])
    x_ptrs = x_ptr + token * HIDDEN + ks
    s_gate = expert * stride_se + (rows_ld // GROUP_N) * stride_sn
    s_up = expert * stride_se + ((INTER + rows_ld) // GROUP_N) * stride_sn
    K_GROUPS: tl.constexpr = (HIDDEN + GROUP_K - 1) // GROUP_K
    acc_gate = tl.zeros([BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_N], tl.float32)
    # integers: per row, part and word, summed once after the loop
    WORDS: tl.constexpr = BLOCK_K // PACK // K_PARTS
    int_gate = tl.zeros([BLOCK_N, K_PARTS, WORDS], tl.float32)
    int_up = tl.zeros([BLOCK_N, K_PARTS, WORDS], tl.float32)
    for i in tl.range(0, (HIDDEN + BLOCK_K - 1) // BLOCK_K, num_stages=NUM_STAGES):
        k_ok = i * BLOCK_K + ks < HIDDEN
        w_ok = (i * BLOCK_K + kw * PACK < HIDDEN)[None, :]
        x = tl.load(x_ptrs + i * BLOCK_K, mask=k_ok, other=0.0).to(tl.float32)
        gate = tl.load(w_ptrs + i * (BLOCK_K // PACK), mask=w_ok, other=0.0)
        up = tl.load(w_ptrs + INTER * (HIDDEN // PACK) + i * (BLOCK_K // PACK), mask=w_ok,
                     other=0.0)
        if QUANT >= 3:
            xs, xsum = _int_slabs(x, K_PARTS, BLOCK_K, PACK)
            int_gate += _int_chunk(gate, xs, xsum, s_ptr + s_gate, z_ptr + s_gate,
                                   i * BLOCK_K, QUANT, BLOCK_N, K_PARTS, GROUP_K, K_GROUPS,
                                   HAS_ZERO, stride_sk, exponent, CONV)
            int_up += _int_chunk(up, xs, xsum, s_ptr + s_up, z_ptr + s_up, i * BLOCK_K, QUANT,
                                 BLOCK_N, K_PARTS, GROUP_K, K_GROUPS, HAS_ZERO, stride_sk,
                                 exponent, CONV)
        else:
            acc_gate += _chunk_sums(gate, x, s_ptr + s_gate, QUANT, BLOCK_N, K_PARTS,
                                    i * BLOCK_K, GROUP_K, K_GROUPS, stride_sk)
            acc_up += _chunk_sums(up, x, s_ptr + s_up, QUANT, BLOCK_N, K_PARTS, i * BLOCK_K,
                                  GROUP_K, K_GROUPS, stride_sk)
    if QUANT >= 3:
        acc_gate = tl.sum(tl.sum(int_gate, axis=2), axis=1)
        acc_up = tl.sum(tl.sum(int_up, axis=2), axis=1)
    if QUANT == 1:
        acc_gate *= tl.load(s_ptr + s_gate)
        acc_up *= tl.load(s_ptr + s_up)
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up  # as the grouped GEMM's epilogue
    tl.store(inter_ptr + slot.to(tl.int64) * INTER + rows, h.to(inter_ptr.dtype.element_ty),
             mask=rows < INTER)


@triton.jit
def _down_gemv_kernel(inter_ptr, w2_ptr, out_ptr, ids_ptr, topk_weights_ptr, stride_we,
                      s_ptr, stride_se, stride_sn, stride_sk, z_ptr, exponent,
                      TOP_K: tl.constexpr,
                      HIDDEN: tl.constexpr, INTER: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, QUANT: tl.constexpr,
                      GROUP_N: tl.constexpr, GROUP_K: tl.constexpr, K_PARTS: tl.constexpr,
                      HAS_ZERO: tl.constexpr, CONV: tl.constexpr = 0):
    token = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_ld = tl.minimum(rows, HIDDEN - 1).to(tl.int64)
    PACK: tl.constexpr = 8 if QUANT == 3 else 4 if QUANT == 4 else 1
    ks = tl.arange(0, BLOCK_K)
    kw = tl.arange(0, BLOCK_K // PACK)
    K_ITERS: tl.constexpr = (INTER + BLOCK_K - 1) // BLOCK_K
    K_GROUPS: tl.constexpr = (INTER + GROUP_K - 1) // GROUP_K
    acc = tl.zeros([BLOCK_N], tl.float32)
    WORDS: tl.constexpr = BLOCK_K // PACK // K_PARTS
    acc_int = tl.zeros([BLOCK_N, K_PARTS, WORDS], tl.float32)  # integers: summed at the end
    # One loop over the token's top_k slots and each one's K chunks, so the pipeline runs
    # through all of them instead of refilling per slot. Each activation chunk is scaled by
    # its slot's routing weight before the dot: sum_k w_k (W_k a_k) = sum_k W_k (w_k a_k).
    # fp8 scales differ per slot's expert, so each chunk's sums are scaled on their own.
    for i in tl.range(0, TOP_K * K_ITERS, num_stages=NUM_STAGES):
        slot = token * TOP_K + i // K_ITERS
        k0 = (i % K_ITERS) * BLOCK_K
        k_ok = k0 + ks < INTER
        expert = tl.load(ids_ptr + slot).to(tl.int64)
        a = tl.load(inter_ptr + slot * INTER + k0 + ks, mask=k_ok, other=0.0).to(tl.float32)
        a = a * tl.load(topk_weights_ptr + slot).to(tl.float32)
        w = tl.load(w2_ptr + expert * stride_we + rows_ld[:, None] * (INTER // PACK)
                    + (k0 // PACK + kw)[None, :], mask=(k0 + kw * PACK < INTER)[None, :],
                    other=0.0)
        s_rows = expert * stride_se + (rows_ld // GROUP_N) * stride_sn
        if QUANT >= 3:
            xs, xsum = _int_slabs(a, K_PARTS, BLOCK_K, PACK)
            acc_int += _int_chunk(w, xs, xsum, s_ptr + s_rows, z_ptr + s_rows, k0, QUANT,
                                  BLOCK_N, K_PARTS, GROUP_K, K_GROUPS, HAS_ZERO, stride_sk,
                                  exponent, CONV)
        else:
            part = _chunk_sums(w, a, s_ptr + s_rows, QUANT, BLOCK_N, K_PARTS, k0, GROUP_K,
                               K_GROUPS, stride_sk)
            if QUANT == 1:
                part *= tl.load(s_ptr + s_rows)
            acc += part
    if QUANT >= 3:
        acc = tl.sum(tl.sum(acc_int, axis=2), axis=1)
    tl.store(out_ptr + token * HIDDEN + rows, acc.to(out_ptr.dtype.element_ty),
             mask=rows < HIDDEN)


def moe_gemv_launches(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg: dict[str, int],
                      quant: ExpertQuant = ExpertQuant()) -> tuple[list[tuple], torch.Tensor]:
    """Both kernels' launches as (kernel, grid, args, kwargs) and the [T, H] output the
    second fills; cfg's BLOCK_N, BLOCK_K, num_warps and num_stages serve both. The
    weights' rows must be contiguous (fused_moe's layouts: w13 [E, 2I, H], w2 [E, H, I])."""
    num_tokens, hidden_size = hidden.shape
    inter = w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    # rows of K values (packed integers: K / 8 or K / 4 words), each contiguous and right
    # after the last
    if w13.stride(1) != w13.shape[2] or w13.stride(2) != 1 or w2.stride(1) != w2.shape[2] \
            or w2.stride(2) != 1:
        raise ValueError("fused_moe (GEMV): the experts' weights need contiguous rows")
    block_n, block_k = cfg["BLOCK_N"], cfg["BLOCK_K"]
    kwargs = {"TOP_K": top_k, "HIDDEN": hidden_size, "INTER": inter, "BLOCK_N": block_n,
              "BLOCK_K": block_k, "NUM_STAGES": cfg["num_stages"],
              "num_warps": cfg["num_warps"], "CONV": int(hidden.is_cuda)}
    ids = topk_ids.contiguous()
    inter_buf = torch.empty(num_tokens * top_k, inter, dtype=hidden.dtype, device=hidden.device)
    out = torch.empty_like(hidden)
    gate_up = (_gate_up_gemv_kernel, (num_tokens * top_k, cdiv(inter, block_n)),
               (hidden.contiguous(), w13, inter_buf, ids, w13.stride(0),
                *quant.w13.pointer_args(w13), EXPONENT_128),
               {**kwargs, **_quant_kwargs(quant.w13, block_k)})
    down = (_down_gemv_kernel, (num_tokens, cdiv(hidden_size, block_n)),
            (inter_buf, w2, out, ids, topk_weights.contiguous(), w2.stride(0),
             *quant.w2.pointer_args(w2), EXPONENT_128),
            {**kwargs, **_quant_kwargs(quant.w2, block_k)})
    return [gate_up, down], out


def _quant_kwargs(quant: WeightQuant, block_k: int) -> dict[str, int]:
    """The scaling's constexprs, and how many parts a K chunk is summed in, each within one
    scale column (both powers of two: a chunk lies within one block or covers whole ones;
    packed integers: parts as wide as the largest power of two dividing the group, at most
    the chunk)."""
    return {**quant.constexprs(), "K_PARTS": max(1, block_k // quant.step) if quant.step
            else 1}
