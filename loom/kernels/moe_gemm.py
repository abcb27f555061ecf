"""The fused MoE's grouped GEMM, for prompt-sized batches: two Triton kernels over the slots
as moe_align (loom/kernels/moe_align.py) sorted them, every BLOCK_M rows one expert's.

  1. gate_up: rows of hidden @ w13[e]^T, both halves in one program -> silu(gate) * up,
  2. down:    that @ w2[e]^T, scaled by the slot's routing weight, written per slot;

the caller sums over k. fp8 weights (loom/kernels/moe_quant.py) are converted to the
activations' dtype tile by tile; their scales multiply each K step's product (per block)
or the accumulator's columns after the K loop (per channel). int4 weights come as
BLOCK_K / 8 int32 words a row per K step (a pointer load or a TMA tile of the packed
[E * N, K / 8] rows), are unpacked and less their zero points in registers, multiplied as
small integers in the activations' dtype, and the step's product times its group's scales;
8-bit integer weights (QUANT 4) likewise, BLOCK_K / 4 words a row per K step.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from loom.kernels.host import cdiv
from loom.kernels.moe_align import moe_align
from loom.kernels.moe_quant import ExpertQuant

logger = logging.getLogger(__name__)


@triton.jit
def _tile_ids(num_row_blocks, NUM_COL_TILES: tl.constexpr, GROUP_M: tl.constexpr):
    """(row block, column tile) of this program in a 1-D grid of num_row_blocks *
    NUM_COL_TILES. GROUP_M = 1: every row block of column tile 0, then of tile 1, ... (the
    order of the former 2-D grid: consecutive programs share one expert's weight tile).
    GROUP_M > 1: GROUP_M row blocks sweep all column tiles together, row block fastest,
    so their activation rows and the expert's weight tiles are reused from L2."""
    pid = tl.program_id(0)
    if GROUP_M == 1:
        pid_m = pid % num_row_blocks
        pid_n = pid // num_row_blocks
    else:
        per_group = GROUP_M * NUM_COL_TILES
        first_m = (pid // per_group) * GROUP_M
        group_rows = tl.minimum(num_row_blocks - first_m, GROUP_M)
        local = pid % per_group
        pid_m = first_m + local % group_rows
        pid_n = local // group_rows
    return pid_m, pid_n


@triton.jit
def _scales(s_ptr, rows, k0, ok, stride_sn, stride_sk, GROUP_N: tl.constexpr,
            GROUP_K: tl.constexpr):
    """The scales of weight rows `rows` in the block column of K offset k0 (s_ptr at the
    expert's; per channel: GROUP_N = 1, and k0 = 0 reads the one column)."""
    return tl.load(s_ptr + (rows // GROUP_N) * stride_sn + (k0 // GROUP_K) * stride_sk,
                   mask=ok, other=0.0)


@triton.jit
def _unpack_int4(words, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, BITS: tl.constexpr):
    """int32 words [ROWS, BLOCK_K * BITS / 32] -> their values [ROWS, BLOCK_K] (int32,
    0 .. 2^BITS - 1; BITS 4 or 8): column k is value k % P of word k // P, P = 32 / BITS
    (shifted, then masked: a word's sign bit does not matter)."""
    PER_WORD: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    shifts = tl.arange(0, PER_WORD) * BITS
    return tl.reshape((words[:, :, None] >> shifts[None, None, :]) & MASK, (ROWS, BLOCK_K))


@triton.jit
def _int4_zeros(z_ptr, rows, group, ok, stride_sn, stride_sk, HAS_ZERO: tl.constexpr,
                BITS: tl.constexpr):
    """The zero points (int32) of weight rows `rows` in group `group` (z_ptr at the
    expert's; the scale's strides); 2^(BITS - 1) (8, or 128) without zero points."""
    if HAS_ZERO:
        return tl.load(z_ptr + rows * stride_sn + group * stride_sk, mask=ok,
                       other=0).to(tl.int32)
    return tl.full(rows.shape, 1 << (BITS - 1), tl.int32)


@triton.jit
def _dot_step(a, w, acc, s_ptr, z_ptr, cols, k0, col_ok, stride_sn, stride_sk,
              PRECISION: tl.constexpr, QUANT: tl.constexpr, GROUP_N: tl.constexpr,
              GROUP_K: tl.constexpr, HAS_ZERO: tl.constexpr):
    """acc + a @ w for one K step, w (an fp8 tile, or already a's dtype) converted to a's
    dtype in registers; per block (QUANT 2) the step's product times its columns' scales
    (BLOCK_K lies within one block column). int4 (QUANT 3) and 8-bit integers (QUANT 4): w
    is the words [BLOCK_N, BLOCK_K / 8] (8-bit: / 4) of one group; their values less the
    zero points (-15..15, or -255..255: exact in a's dtype, bf16 holding every integer up
    to 256; through float32, which Triton 3.6's interpreter needs and sm_90 folds into one
    conversion), then the step's product times the group's scales."""
    if QUANT >= 3:  # (an if / else: the compiler reads past a constexpr branch's return)
        BITS: tl.constexpr = 4 if QUANT == 3 else 8
        q = _unpack_int4(w, cols.shape[0], a.shape[1], BITS)
        z = _int4_zeros(z_ptr, cols, k0 // GROUP_K, col_ok, stride_sn, stride_sk, HAS_ZERO,
                        BITS)
        w = (q - z[:, None]).to(tl.float32).to(a.dtype)
        s = _scales(s_ptr, cols, k0, col_ok, stride_sn, stride_sk, 1, GROUP_K)
        acc += tl.dot(a, tl.trans(w), input_precision=PRECISION) * s.to(tl.float32)[None, :]
    elif QUANT == 2:
        s = _scales(s_ptr, cols, k0, col_ok, stride_sn, stride_sk, GROUP_N, GROUP_K)
        acc += tl.dot(a, w.to(a.dtype), input_precision=PRECISION) * s[None, :]
    else:
        acc = tl.dot(a, w.to(a.dtype), acc, input_precision=PRECISION)
    return acc


@triton.jit
def _channel_scaled(acc, s_ptr, cols, col_ok, stride_sn, QUANT: tl.constexpr):
    """The accumulator's columns times their weight rows' scales, per channel (QUANT 1)."""
    if QUANT == 1:
        return acc * _scales(s_ptr, cols, 0, col_ok, stride_sn, 0, 1, 1)[None, :]
    return acc


# The row counts are launch sizes, not shapes worth a compiled variant each.
@triton.jit(do_not_specialize=["num_slots", "num_row_blocks"])
def _gate_up_kernel(
    x_ptr, w13_ptr, inter_ptr, sorted_ids_ptr, block_expert_ptr, num_slots, num_row_blocks,
    stride_xt, stride_we, stride_wn, stride_wk, stride_it, s_ptr, stride_se, stride_sn,
    stride_sk, z_ptr, TOP_K: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    QUANT: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    HAS_ZERO: tl.constexpr,
):
    # TMA: w13_ptr is a tensor descriptor over w13 as [E * 2I, H] rows (int4: [E * 2I, H / 8]
    # words, 8-bit: H / 4); else a pointer. QUANT: 0 unquantized, 1 an fp8 scale per output
    # channel, 2 per block, 3 int4 (4: 8-bit integers) with a scale (and zero point, z_ptr)
    # per group (moe_quant.py).
    PER_WORD: tl.constexpr = 8 if QUANT == 3 else 4  # packed values a word (QUANT >= 3)
    pid_m, pid_n = _tile_ids(num_row_blocks, (INTER + BLOCK_N - 1) // BLOCK_N, GROUP_M)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:  # the capacity bound over-provisions blocks; these have no rows
        return
    s_ptr += expert.to(tl.int64) * stride_se
    z_ptr += expert.to(tl.int64) * stride_se
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ids_ptr + rows)
    row_ok = slot < num_slots
    token = (slot // TOP_K).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < INTER
    # A descriptor's tile past this expert's INTER gate rows reads its up rows (or past the
    # last expert, zeros): those columns are never stored.
    w_row = expert * (2 * INTER) + pid_n * BLOCK_N
    # gate and up columns n and INTER + n live in one program so the SwiGLU product is
    # formed in registers and the [P, 2 * INTER] pre-activation never reaches memory.
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):  # HIDDEN is constexpr: a model constant
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < HIDDEN
        x = tl.load(x_ptr + token[:, None] * stride_xt + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if QUANT >= 3:  # BLOCK_K divides the group and so HIDDEN: no K mask
            if TMA:
                w_gate = w13_ptr.load([w_row, k0 // PER_WORD])
                w_up = w13_ptr.load([w_row + INTER, k0 // PER_WORD])
            else:
                w_ptr = (w13_ptr + expert.to(tl.int64) * stride_we + cols[:, None] * stride_wn
                         + (k0 // PER_WORD + tl.arange(0, BLOCK_K // PER_WORD))[None, :]
                         * stride_wk)
                w_gate = tl.load(w_ptr, mask=col_ok[:, None], other=0)
                w_up = tl.load(w_ptr + INTER * stride_wn, mask=col_ok[:, None], other=0)
        elif TMA:
            w_gate = w13_ptr.load([w_row, k0]).T
            w_up = w13_ptr.load([w_row + INTER, k0]).T
        else:
            w_mask = k_ok[:, None] & col_ok[None, :]
            w_ptr = (w13_ptr + expert.to(tl.int64) * stride_we + ks[:, None] * stride_wk
                     + cols[None, :] * stride_wn)
            w_gate = tl.load(w_ptr, mask=w_mask, other=0.0)
            w_up = tl.load(w_ptr + INTER * stride_wn, mask=w_mask, other=0.0)
        acc_gate = _dot_step(x, w_gate, acc_gate, s_ptr, z_ptr, cols, k0, col_ok, stride_sn,
                             stride_sk, PRECISION, QUANT, GROUP_N, GROUP_K, HAS_ZERO)
        acc_up = _dot_step(x, w_up, acc_up, s_ptr, z_ptr, INTER + cols, k0, col_ok,
                           stride_sn, stride_sk, PRECISION, QUANT, GROUP_N, GROUP_K, HAS_ZERO)
    acc_gate = _channel_scaled(acc_gate, s_ptr, cols, col_ok, stride_sn, QUANT)
    acc_up = _channel_scaled(acc_up, s_ptr, INTER + cols, col_ok, stride_sn, QUANT)
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up
    dst = inter_ptr + rows.to(tl.int64)[:, None] * stride_it + cols[None, :]
    tl.store(dst, h.to(inter_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["num_slots", "num_row_blocks"])
def _down_kernel(
    inter_ptr, w2_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, topk_weights_ptr,
    num_slots, num_row_blocks, stride_it, stride_we, stride_wn, stride_wk, stride_ot,
    s_ptr, stride_se, stride_sn, stride_sk, z_ptr, HIDDEN: tl.constexpr,
    INTER: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
    QUANT: tl.constexpr, GROUP_N: tl.constexpr, GROUP_K: tl.constexpr,
    HAS_ZERO: tl.constexpr,
):
    # TMA: inter_ptr and w2_ptr are tensor descriptors, over the [P, I] buffer and over w2
    # as [E * H, I] rows. The buffer's padding rows hold whatever was there: each output
    # row depends on its own row alone, and padding rows are never stored.
    PER_WORD: tl.constexpr = 8 if QUANT == 3 else 4  # packed values a word (QUANT >= 3)
    pid_m, pid_n = _tile_ids(num_row_blocks, (HIDDEN + BLOCK_N - 1) // BLOCK_N, GROUP_M)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    s_ptr += expert.to(tl.int64) * stride_se
    z_ptr += expert.to(tl.int64) * stride_se
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ids_ptr + rows)
    row_ok = slot < num_slots
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < HIDDEN
    w_row = expert * HIDDEN + pid_n * BLOCK_N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        if TMA:
            a = inter_ptr.load([pid_m * BLOCK_M, k0])
            if QUANT >= 3:
                w = w2_ptr.load([w_row, k0 // PER_WORD])
            else:
                w = w2_ptr.load([w_row, k0]).T
        else:
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < INTER
            a = tl.load(inter_ptr + rows.to(tl.int64)[:, None] * stride_it + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w_ptr = w2_ptr + expert.to(tl.int64) * stride_we
            if QUANT >= 3:  # BLOCK_K divides the group and so INTER: no K mask
                w = tl.load(w_ptr + cols[:, None] * stride_wn
                            + (k0 // PER_WORD + tl.arange(0, BLOCK_K // PER_WORD))[None, :]
                            * stride_wk, mask=col_ok[:, None], other=0)
            else:
                w = tl.load(w_ptr + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                            mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = _dot_step(a, w, acc, s_ptr, z_ptr, cols, k0, col_ok, stride_sn, stride_sk,
                        PRECISION, QUANT, GROUP_N, GROUP_K, HAS_ZERO)
    acc = _channel_scaled(acc, s_ptr, cols, col_ok, stride_sn, QUANT)
    weight = tl.load(topk_weights_ptr + slot, mask=row_ok, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    # One row per slot (not an atomic add per token): deterministic, any output dtype.
    dst = out_ptr + slot.to(tl.int64)[:, None] * stride_ot + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def tma_ok(*tensors: torch.Tensor, box_bytes: int = 16) -> bool:
    """Whether TMA descriptors can cover these tensors as 2-D row-major matrices: each
    contiguous, 16-byte aligned, rows a multiple of 16 bytes, and a tile's rows (box_bytes,
    the least of the loads') a multiple of 16 bytes (the copy engine's rules). Where they
    cannot, the kernels take pointer loads (said once)."""
    ok = box_bytes % 16 == 0 and all(t.is_contiguous() and t.data_ptr() % 16 == 0
                                     and t.shape[-1] * t.element_size() % 16 == 0
                                     for t in tensors)
    if not ok:
        _say_no_tma(tuple(tuple(t.shape) for t in tensors), box_bytes)
    return ok


@functools.cache
def _say_no_tma(shapes: tuple, box_bytes: int = 16) -> None:
    logger.info("fused_moe: the config asks for TMA but %s are not contiguous 16-byte aligned "
                "rows (or a tile's rows are %d bytes); pointer loads instead", shapes,
                box_bytes)


Launch = tuple[Any, tuple[int], tuple, dict[str, Any]]
"""(kernel, grid, args, kwargs)."""


def moe_launches(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg: dict[str, int],
                 quant: ExpertQuant = ExpertQuant()) -> tuple[list[Launch], torch.Tensor]:
    """moe_align for cfg's BLOCK_M, then the two kernels' launches, gate_up first, and the
    [T * top_k, H] buffer the second fills (one row per slot). Separate from running them
    so a probe can time each kernel alone."""
    num_tokens, hidden_size = hidden.shape
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    top_k = topk_ids.shape[1]
    num_slots = num_tokens * top_k
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    sorted_ids, block_expert = moe_align(topk_ids, num_experts, block_m)
    num_blocks = block_expert.numel()
    inter_buf = torch.empty(sorted_ids.numel(), inter, dtype=hidden.dtype, device=hidden.device)
    k13, k2 = quant.w13.block_k(cfg["BLOCK_K"]), quant.w2.block_k(cfg["BLOCK_K"])
    pack = quant.w13.per_word  # packed integers: a row's K step is BLOCK_K / 8 (/ 4) words
    box = min(k13, k2) // pack * w13.element_size()
    tma = bool(cfg.get("TMA")) and tma_ok(w13, w2, inter_buf, box_bytes=box)
    # One program per (row block, column tile), in the order _tile_ids gives them.
    launch = {"BLOCK_M": block_m, "BLOCK_N": block_n, "GROUP_M": cfg["GROUP_M"],
              "PRECISION": "ieee" if hidden.dtype == torch.float32 else "tf32", "TMA": tma,
              "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    w13_arg, w2_arg, inter_in = w13, w2, inter_buf
    if tma:
        w13_arg = TensorDescriptor.from_tensor(w13.view(-1, w13.shape[2]), [block_n, k13 // pack])
        w2_arg = TensorDescriptor.from_tensor(w2.view(-1, w2.shape[2]), [block_n, k2 // pack])
        inter_in = TensorDescriptor.from_tensor(inter_buf, [block_m, k2])
    gate_up = (_gate_up_kernel, (num_blocks * cdiv(inter, block_n),), (
        hidden, w13_arg, inter_buf, sorted_ids, block_expert, num_slots, num_blocks,
        hidden.stride(0), w13.stride(0), w13.stride(1), w13.stride(2), inter_buf.stride(0),
        *quant.w13.pointer_args(w13)),
        {"TOP_K": top_k, "HIDDEN": hidden_size, "INTER": inter, "BLOCK_K": k13, **launch,
         **quant.w13.constexprs()})
    per_slot = torch.empty(num_slots, hidden_size, dtype=hidden.dtype, device=hidden.device)
    down = (_down_kernel, (num_blocks * cdiv(hidden_size, block_n),), (
        inter_in, w2_arg, per_slot, sorted_ids, block_expert, topk_weights.contiguous(),
        num_slots, num_blocks, inter_buf.stride(0), w2.stride(0), w2.stride(1), w2.stride(2),
        per_slot.stride(0), *quant.w2.pointer_args(w2)),
        {"HIDDEN": hidden_size, "INTER": inter, "BLOCK_K": k2, **launch,
         **quant.w2.constexprs()})
    return [gate_up, down], per_slot
