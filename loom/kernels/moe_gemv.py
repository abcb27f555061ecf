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
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels.host import cdiv


@triton.jit
def _gate_up_gemv_kernel(x_ptr, w13_ptr, inter_ptr, ids_ptr, stride_we,
                         TOP_K: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         NUM_STAGES: tl.constexpr):
    slot = tl.program_id(0)
    token = (slot // TOP_K).to(tl.int64)
    expert = tl.load(ids_ptr + slot).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    # Clamped, not masked: the loads stay unpredicated; only the store is masked.
    rows_ld = tl.minimum(rows, INTER - 1)
    ks = tl.arange(0, BLOCK_K)
    w_ptrs = w13_ptr + expert * stride_we + rows_ld.to(tl.int64)[:, None] * HIDDEN + ks[None, :]
    x_ptrs = x_ptr + token * HIDDEN + ks
    acc_gate = tl.zeros([BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_N], tl.float32)
    for i in tl.range(0, (HIDDEN + BLOCK_K - 1) // BLOCK_K, num_stages=NUM_STAGES):
        k_ok = i * BLOCK_K + ks < HIDDEN
        x = tl.load(x_ptrs + i * BLOCK_K, mask=k_ok, other=0.0).to(tl.float32)
        gate = tl.load(w_ptrs + i * BLOCK_K, mask=k_ok[None, :], other=0.0)
        up = tl.load(w_ptrs + INTER * HIDDEN + i * BLOCK_K, mask=k_ok[None, :], other=0.0)
        acc_gate += tl.sum(gate.to(tl.float32) * x[None, :], axis=1)
        acc_up += tl.sum(up.to(tl.float32) * x[None, :], axis=1)
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up  # as the grouped GEMM's epilogue
    tl.store(inter_ptr + slot.to(tl.int64) * INTER + rows, h.to(inter_ptr.dtype.element_ty),
             mask=rows < INTER)


@triton.jit
def _down_gemv_kernel(inter_ptr, w2_ptr, out_ptr, ids_ptr, topk_weights_ptr, stride_we,
                      TOP_K: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      NUM_STAGES: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_ld = tl.minimum(rows, HIDDEN - 1).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    K_ITERS: tl.constexpr = (INTER + BLOCK_K - 1) // BLOCK_K
    acc = tl.zeros([BLOCK_N], tl.float32)
    # One loop over the token's top_k slots and each one's K chunks, so the pipeline runs
    # through all of them instead of refilling per slot. Each activation chunk is scaled by
    # its slot's routing weight before the dot: sum_k w_k (W_k a_k) = sum_k W_k (w_k a_k).
    for i in tl.range(0, TOP_K * K_ITERS, num_stages=NUM_STAGES):
        slot = token * TOP_K + i // K_ITERS
        cols = (i % K_ITERS) * BLOCK_K + ks
        k_ok = cols < INTER
        expert = tl.load(ids_ptr + slot).to(tl.int64)
        a = tl.load(inter_ptr + slot * INTER + cols, mask=k_ok, other=0.0).to(tl.float32)
        a = a * tl.load(topk_weights_ptr + slot).to(tl.float32)
        w = tl.load(w2_ptr + expert * stride_we + rows_ld[:, None] * INTER + cols[None, :],
                    mask=k_ok[None, :], other=0.0)
        acc += tl.sum(w.to(tl.float32) * a[None, :], axis=1)
    tl.store(out_ptr + token * HIDDEN + rows, acc.to(out_ptr.dtype.element_ty),
             mask=rows < HIDDEN)


def moe_gemv_launches(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg: dict[str, int]
                      ) -> tuple[list[tuple], torch.Tensor]:
    """Both kernels' launches as (kernel, grid, args, kwargs) and the [T, H] output the
    second fills; cfg's BLOCK_N, BLOCK_K, num_warps and num_stages serve both. The
    weights' rows must be contiguous (fused_moe's layouts: w13 [E, 2I, H], w2 [E, H, I])."""
    num_tokens, hidden_size = hidden.shape
    inter = w13.shape[1] // 2
    top_k = topk_ids.shape[1]
    if w13.stride(1) != hidden_size or w13.stride(2) != 1 or w2.stride(1) != inter \
            or w2.stride(2) != 1:
        raise ValueError("fused_moe (GEMV): the experts' weights need contiguous rows")
    block_n = cfg["BLOCK_N"]
    kwargs = {"TOP_K": top_k, "HIDDEN": hidden_size, "INTER": inter, "BLOCK_N": block_n,
              "BLOCK_K": cfg["BLOCK_K"], "NUM_STAGES": cfg["num_stages"],
              "num_warps": cfg["num_warps"]}
    ids = topk_ids.contiguous()
    inter_buf = torch.empty(num_tokens * top_k, inter, dtype=hidden.dtype, device=hidden.device)
    out = torch.empty_like(hidden)
    gate_up = (_gate_up_gemv_kernel, (num_tokens * top_k, cdiv(inter, block_n)),
               (hidden.contiguous(), w13, inter_buf, ids, w13.stride(0)), kwargs)
    down = (_down_gemv_kernel, (num_tokens, cdiv(hidden_size, block_n)),
            (inter_buf, w2, out, ids, topk_weights.contiguous(), w2.stride(0)), kwargs)
    return [gate_up, down], out
