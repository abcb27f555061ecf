"""Fused mixture-of-experts MLP (Qwen3-MoE): top-k routed SwiGLU experts.

Each (token, k) pair is a "slot" t * top_k + k. Slots are sorted by expert and each
expert's run is padded to a multiple of BLOCK_M, so every BLOCK_M rows of the sorted order
belong to one expert and a grouped GEMM can treat them as one dense tile. Two kernels:
  1. gate_up: rows of hidden @ w13[e]^T, both halves in one program -> silu(gate) * up,
  2. down:    that @ w2[e]^T, scaled by the slot's routing weight, written per slot;
then a sum over k. Alignment uses torch ops only, sized by an upper bound, so there is no
host sync and the launch shapes depend on T, top_k and E alone (CUDA-graph friendly).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


def moe_align(topk_ids: torch.Tensor, num_experts: int,
              block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort slots by expert, padding each expert's run to a multiple of block_m.

    Returns sorted_ids [P] (int32 slot index, or T*top_k for padding) and block_expert
    [P // block_m] (int32 expert of each row block, -1 for blocks past the last expert).
    P is an upper bound on the padded length, so nothing here waits for the device.
    """
    flat = topk_ids.flatten().to(torch.int64)
    num_slots = flat.numel()
    capacity = num_slots + min(num_experts, num_slots) * (block_m - 1)
    capacity = triton.cdiv(capacity, block_m) * block_m
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))  # bincount would sync for its size
    padded = (counts + block_m - 1) // block_m * block_m
    pad_end = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    expert = flat[order]
    rank = torch.arange(num_slots, device=flat.device) - (counts.cumsum(0) - counts)[expert]
    sorted_ids = torch.full((capacity,), num_slots, dtype=torch.int32, device=flat.device)
    sorted_ids[(pad_end - padded)[expert] + rank] = order.to(torch.int32)
    block_start = torch.arange(0, capacity, block_m, device=flat.device)
    block_expert = torch.searchsorted(pad_end, block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1)
    return sorted_ids, block_expert.to(torch.int32)


@triton.jit
def _gate_up_kernel(
    x_ptr, w13_ptr, inter_ptr, sorted_ids_ptr, block_expert_ptr, num_slots,
    stride_xt, stride_we, stride_wn, stride_wk, stride_it,
    TOP_K: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:  # the capacity bound over-provisions blocks; these have no rows
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ids_ptr + rows)
    row_ok = slot < num_slots
    token = (slot // TOP_K).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < INTER
    w_base = w13_ptr + expert.to(tl.int64) * stride_we
    # gate and up columns n and INTER + n live in one program so the SwiGLU product is
    # formed in registers and the [P, 2 * INTER] pre-activation never reaches memory.
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):  # HIDDEN is constexpr: a model constant
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < HIDDEN
        x = tl.load(x_ptr + token[:, None] * stride_xt + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w_mask = k_ok[:, None] & col_ok[None, :]
        w_ptr = w_base + ks[:, None] * stride_wk + cols[None, :] * stride_wn
        w_gate = tl.load(w_ptr, mask=w_mask, other=0.0)
        w_up = tl.load(w_ptr + INTER * stride_wn, mask=w_mask, other=0.0)
        acc_gate = tl.dot(x, w_gate, acc_gate, input_precision=PRECISION)
        acc_up = tl.dot(x, w_up, acc_up, input_precision=PRECISION)
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up
    dst = inter_ptr + rows.to(tl.int64)[:, None] * stride_it + cols[None, :]
    tl.store(dst, h.to(inter_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(
    inter_ptr, w2_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, topk_weights_ptr,
    num_slots, stride_it, stride_we, stride_wn, stride_wk, stride_ot,
    HIDDEN: tl.constexpr, INTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ids_ptr + rows)
    row_ok = slot < num_slots
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < HIDDEN
    w_base = w2_ptr + expert.to(tl.int64) * stride_we
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, INTER, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < INTER
        a = tl.load(inter_ptr + rows.to(tl.int64)[:, None] * stride_it + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + ks[:, None] * stride_wk + cols[None, :] * stride_wn,
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    weight = tl.load(topk_weights_ptr + slot, mask=row_ok, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    # One row per slot (not an atomic add per token): deterministic, any output dtype.
    dst = out_ptr + slot.to(tl.int64)[:, None] * stride_ot + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _default_block_m(num_slots: int, num_experts: int) -> int:
    # Few rows per expert (decode) waste most of a tall tile on padding.
    per_expert = num_slots / num_experts
    return 16 if per_expert <= 16 else 32 if per_expert <= 64 else 64


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
              block_m: int | None = None, block_n: int | None = None,
              block_k: int | None = None,
              num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """sum_k topk_weights[t, k] * (silu(x W_g^T) * (x W_u^T)) W_2^T for expert topk_ids[t, k].

    hidden [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I];
    topk_weights / topk_ids [T, K]. Returns [T, H] in hidden's dtype.
    """
    num_tokens, hidden_size = hidden.shape
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    top_k = topk_ids.shape[1]
    if num_tokens == 0:
        return torch.zeros_like(hidden)
    if hidden.stride(1) != 1 or w13.shape[2] != hidden_size or w2.shape[1:] != (hidden_size, inter):
        raise ValueError("fused_moe: expected hidden [T, H] (contiguous rows), "
                         "w13 [E, 2I, H], w2 [E, H, I]")
    num_slots = num_tokens * top_k
    block_m = block_m or _default_block_m(num_slots, num_experts)
    # fp32 takes exact FMA dots whose operands need far more registers: halve the tile
    # (the sizes that ptxas compiles without spills for sm_90).
    block_n = block_n or (32 if hidden.dtype == torch.float32 else 64)
    block_k = block_k or (32 if hidden.dtype == torch.float32 else 64)
    sorted_ids, block_expert = moe_align(topk_ids, num_experts, block_m)
    num_blocks = block_expert.numel()
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"
    inter_buf = torch.empty(sorted_ids.numel(), inter, dtype=hidden.dtype, device=hidden.device)
    _gate_up_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        hidden, w13, inter_buf, sorted_ids, block_expert, num_slots,
        hidden.stride(0), w13.stride(0), w13.stride(1), w13.stride(2), inter_buf.stride(0),
        TOP_K=top_k, HIDDEN=hidden_size, INTER=inter, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, PRECISION=precision, num_warps=num_warps, num_stages=num_stages)
    per_slot = torch.empty(num_slots, hidden_size, dtype=hidden.dtype, device=hidden.device)
    _down_kernel[(num_blocks, triton.cdiv(hidden_size, block_n))](
        inter_buf, w2, per_slot, sorted_ids, block_expert, topk_weights.contiguous(),
        num_slots, inter_buf.stride(0), w2.stride(0), w2.stride(1), w2.stride(2),
        per_slot.stride(0), HIDDEN=hidden_size, INTER=inter, BLOCK_M=block_m,
        BLOCK_N=block_n, BLOCK_K=block_k, PRECISION=precision, num_warps=num_warps,
        num_stages=num_stages)
    return per_slot.view(num_tokens, top_k, hidden_size).sum(dim=1)


def moe_reference(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """The same computation in plain torch, one expert at a time, in fp32."""
    x = hidden.float()
    out = torch.zeros_like(x)
    inter = w13.shape[1] // 2
    for e in torch.unique(topk_ids).tolist():
        token, k = torch.nonzero(topk_ids == e, as_tuple=True)
        gate_up = x[token] @ w13[e].float().t()
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = (h @ w2[e].float().t()) * topk_weights[token, k, None].float()
        out.index_add_(0, token, y)
    return out.to(hidden.dtype)
