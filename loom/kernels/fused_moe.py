"""Fused mixture-of-experts MLP (Qwen3-MoE): top-k routed SwiGLU experts.

Each (token, k) pair is a "slot" t * top_k + k. Slots are sorted by expert and each
expert's run is padded to a multiple of BLOCK_M, so every BLOCK_M rows of the sorted order
belong to one expert and a grouped GEMM can treat them as one dense tile. Two kernels:
  1. gate_up: rows of hidden @ w13[e]^T, both halves in one program -> silu(gate) * up,
  2. down:    that @ w2[e]^T, scaled by the slot's routing weight, written per slot;
then a sum over k. The alignment (two small Triton kernels) is sized by an upper bound, so
there is no host sync and the launch shapes depend on T, top_k and E alone (CUDA-graph
friendly). A config with GEMV = 1 takes loom/kernels/moe_gemv.py's two kernels instead: for
a handful of tokens, each slot reads its expert's rows directly, nothing sorted or padded.

Tiles come from a config (loom/kernels/moe_config.py): one passed in, else a tuned one,
else the defaults.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from loom import envs
from loom.kernels.host import cdiv, next_power_of_2
from loom.kernels.moe_config import get_config, normalize_config
from loom.kernels.moe_gemv import moe_gemv_launches
from loom.library import loom_op

logger = logging.getLogger(__name__)


def _align_capacity(num_slots: int, num_experts: int, block_m: int) -> int:
    return cdiv(num_slots + min(num_experts, num_slots) * (block_m - 1), block_m) * block_m


_ALIGN_CHUNK = 64
"""Slots (and row blocks) per program of the align kernels. The place kernel compares a
chunk against every expert, a [CHUNK, E] tile, so this stays small."""


# The slot and block counts are launch sizes: specialised (on divisibility by 16), each
# parity of a step's token count compiled a variant of its own mid-run (run_zzo).
@triton.jit(do_not_specialize=["num_slots"])
def _align_count_kernel(ids_ptr, counts_ptr, rank_ptr, num_slots, CHUNK: tl.constexpr):
    # Each slot takes the next place in its expert's run: the old value of an atomic
    # increment. The order within a run is arbitrary; every row's result is the same
    # whatever its neighbours, so only the runs matter.
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    ok = offs < num_slots
    expert = tl.load(ids_ptr + offs, mask=ok, other=0)
    rank = tl.atomic_add(counts_ptr + expert, 1, mask=ok)
    tl.store(rank_ptr + offs, rank, mask=ok)


@triton.jit(do_not_specialize=["num_slots", "num_blocks"])
def _align_place_kernel(ids_ptr, counts_ptr, rank_ptr, sorted_ids_ptr, block_expert_ptr,
                        num_slots, num_blocks, NUM_EXPERTS: tl.constexpr,
                        EXPERTS_PAD: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr):
    # Every program derives the runs' padded starts from the counts (a cumsum over the
    # experts, cheap), then places its chunk of slots and labels its chunk of row blocks.
    experts = tl.arange(0, EXPERTS_PAD)
    counts = tl.load(counts_ptr + experts, mask=experts < NUM_EXPERTS, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    pad_end = tl.cumsum(padded, axis=0)
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    ok = offs < num_slots
    expert = tl.load(ids_ptr + offs, mask=ok, other=0).to(tl.int32)
    rank = tl.load(rank_ptr + offs, mask=ok, other=0)
    start = tl.gather(pad_end - padded, expert, 0)
    tl.store(sorted_ids_ptr + start + rank, offs.to(tl.int32), mask=ok)
    # A row block belongs to the first expert whose padded run ends past its start.
    block_start = offs * BLOCK_M
    ends = tl.where(experts < NUM_EXPERTS, pad_end, 2147483647)
    owner = tl.sum((ends[None, :] <= block_start[:, None]).to(tl.int32), axis=1)
    owner = tl.where(owner < NUM_EXPERTS, owner, -1)
    tl.store(block_expert_ptr + offs, owner, mask=offs < num_blocks)


def moe_align(topk_ids: torch.Tensor, num_experts: int,
              block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sort slots by expert, padding each expert's run to a multiple of block_m.

    Returns sorted_ids [P] (int32 slot index, or T*top_k for padding) and block_expert
    [P // block_m] (int32 expert of each row block, -1 for blocks past the last expert).
    P is an upper bound on the padded length, so nothing here waits for the device.
    Four launches (two fills, two Triton kernels) whatever the size: as eager torch ops the
    same took ~15 kernels, 43 us of a 79 us decode-size MoE call on an H200.
    """
    if envs.moe_align_torch():
        return moe_align_reference(topk_ids, num_experts, block_m)
    flat = topk_ids.flatten()
    num_slots = flat.numel()
    capacity = _align_capacity(num_slots, num_experts, block_m)
    num_blocks = capacity // block_m
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
    rank = torch.empty(num_slots, dtype=torch.int32, device=device)
    sorted_ids = torch.full((capacity,), num_slots, dtype=torch.int32, device=device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=device)
    _align_count_kernel[(cdiv(num_slots, _ALIGN_CHUNK),)](
        flat, counts, rank, num_slots, CHUNK=_ALIGN_CHUNK)
    _align_place_kernel[(cdiv(max(num_slots, num_blocks), _ALIGN_CHUNK),)](
        flat, counts, rank, sorted_ids, block_expert, num_slots, num_blocks,
        NUM_EXPERTS=num_experts, EXPERTS_PAD=next_power_of_2(num_experts),
        BLOCK_M=block_m, CHUNK=_ALIGN_CHUNK)
    return sorted_ids, block_expert


def moe_align_reference(topk_ids: torch.Tensor, num_experts: int,
                        block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """moe_align in torch ops, a stable sort (each run in slot order): the tests' check."""
    flat = topk_ids.flatten().to(torch.int64)
    num_slots = flat.numel()
    capacity = _align_capacity(num_slots, num_experts, block_m)
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
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


# The row counts are launch sizes, not shapes worth a compiled variant each.
@triton.jit(do_not_specialize=["num_slots", "num_row_blocks"])
def _gate_up_kernel(
    x_ptr, w13_ptr, inter_ptr, sorted_ids_ptr, block_expert_ptr, num_slots, num_row_blocks,
    stride_xt, stride_we, stride_wn, stride_wk, stride_it,
    TOP_K: tl.constexpr, HIDDEN: tl.constexpr, INTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    # TMA: w13_ptr is a tensor descriptor over w13 as [E * 2I, H] rows; else a pointer.
    pid_m, pid_n = _tile_ids(num_row_blocks, (INTER + BLOCK_N - 1) // BLOCK_N, GROUP_M)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:  # the capacity bound over-provisions blocks; these have no rows
        return
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
        if TMA:
            w_gate = w13_ptr.load([w_row, k0]).T
            w_up = w13_ptr.load([w_row + INTER, k0]).T
        else:
            w_mask = k_ok[:, None] & col_ok[None, :]
            w_ptr = (w13_ptr + expert.to(tl.int64) * stride_we + ks[:, None] * stride_wk
                     + cols[None, :] * stride_wn)
            w_gate = tl.load(w_ptr, mask=w_mask, other=0.0)
            w_up = tl.load(w_ptr + INTER * stride_wn, mask=w_mask, other=0.0)
        acc_gate = tl.dot(x, w_gate, acc_gate, input_precision=PRECISION)
        acc_up = tl.dot(x, w_up, acc_up, input_precision=PRECISION)
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up
    dst = inter_ptr + rows.to(tl.int64)[:, None] * stride_it + cols[None, :]
    tl.store(dst, h.to(inter_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["num_slots", "num_row_blocks"])
def _down_kernel(
    inter_ptr, w2_ptr, out_ptr, sorted_ids_ptr, block_expert_ptr, topk_weights_ptr,
    num_slots, num_row_blocks, stride_it, stride_we, stride_wn, stride_wk, stride_ot,
    HIDDEN: tl.constexpr, INTER: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    # TMA: inter_ptr and w2_ptr are tensor descriptors, over the [P, I] buffer and over w2
    # as [E * H, I] rows. The buffer's padding rows hold whatever was there: each output
    # row depends on its own row alone, and padding rows are never stored.
    pid_m, pid_n = _tile_ids(num_row_blocks, (HIDDEN + BLOCK_N - 1) // BLOCK_N, GROUP_M)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
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
            w = w2_ptr.load([w_row, k0]).T
        else:
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < INTER
            a = tl.load(inter_ptr + rows.to(tl.int64)[:, None] * stride_it + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w2_ptr + expert.to(tl.int64) * stride_we + ks[:, None] * stride_wk
                        + cols[None, :] * stride_wn,
                        mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=PRECISION)
    weight = tl.load(topk_weights_ptr + slot, mask=row_ok, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    # One row per slot (not an atomic add per token): deterministic, any output dtype.
    dst = out_ptr + slot.to(tl.int64)[:, None] * stride_ot + cols[None, :]
    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
              config: dict[str, Any] | None = None,
              block_m: int | None = None, block_n: int | None = None,
              block_k: int | None = None, group_m: int | None = None,
              num_warps: int | None = None, num_stages: int | None = None,
              gemv: int | None = None, tma: int | None = None) -> torch.Tensor:
    """sum_k topk_weights[t, k] * (silu(x W_g^T) * (x W_u^T)) W_2^T for expert topk_ids[t, k].

    hidden [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I];
    topk_weights / topk_ids [T, K]. Returns [T, H] in hidden's dtype.
    Tiles: `config` (see get_config; None looks up a tuned one), then any of block_m ...
    tma given here on top.
    """
    num_tokens, hidden_size = hidden.shape
    if num_tokens == 0:
        return torch.zeros_like(hidden)
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    if hidden.stride(1) != 1 or w13.shape[2] != hidden_size or w2.shape[1:] != (hidden_size, inter):
        raise ValueError("fused_moe: expected hidden [T, H] (contiguous rows), "
                         "w13 [E, 2I, H], w2 [E, H, I]")
    cfg = get_config(num_tokens, topk_ids.shape[1], num_experts, inter, hidden.dtype,
                     hidden.device, config)
    overrides = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
                 "GROUP_M": group_m, "num_warps": num_warps, "num_stages": num_stages,
                 "GEMV": gemv, "TMA": tma}
    given = {k: v for k, v in overrides.items() if v is not None}
    if given:  # checked together: BLOCK_N's least value depends on GEMV
        cfg = normalize_config({**cfg, **given})
    return _fused_moe(hidden, w13, w2, topk_weights, topk_ids, cfg)


@loom_op("fused_moe", "(Tensor hidden, Tensor w13, Tensor w2, Tensor topk_weights, "
                     "Tensor topk_ids) -> Tensor")
def fused_moe_op(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """fused_moe as one opaque operator (`torch.ops.loom.fused_moe`). Called directly,
    fused_moe is traced by torch.compile: its tuned config then comes from the token count
    at trace time, with a range guard per key crossed, and a token count past a guard
    recompiles the graph. Through this op the config is chosen at run time from the real
    token count, each CUDA graph capturing its own, and the graph never recompiles for it."""
    return fused_moe(hidden, w13, w2, topk_weights, topk_ids)


@fused_moe_op.register_fake
def _(hidden, w13, w2, topk_weights, topk_ids):
    return hidden.new_empty(hidden.shape)


def compile_fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                      config: dict[str, Any]) -> None:
    """Compile both kernels for `config` and these inputs without running them (the
    tuner compiles its whole grid this way, on several threads, before timing any)."""
    num_experts, two_inter, _ = w13.shape
    cfg = get_config(hidden.shape[0], topk_ids.shape[1], num_experts, two_inter // 2,
                     hidden.dtype, hidden.device, config)
    _fused_moe(hidden, w13, w2, topk_weights, topk_ids, cfg, compile_only=True)


def tma_ok(*tensors: torch.Tensor) -> bool:
    """Whether TMA descriptors can cover these tensors as 2-D row-major matrices: each
    contiguous, 16-byte aligned, rows a multiple of 16 bytes (the copy engine's rules).
    Where they cannot, the kernels take pointer loads (said once)."""
    ok = all(t.is_contiguous() and t.data_ptr() % 16 == 0
             and t.shape[-1] * t.element_size() % 16 == 0 for t in tensors)
    if not ok:
        _say_no_tma(tuple(tuple(t.shape) for t in tensors))
    return ok


@functools.cache
def _say_no_tma(shapes: tuple) -> None:
    logger.info("fused_moe: the config asks for TMA but %s are not contiguous 16-byte aligned "
                "rows; pointer loads instead", shapes)


def moe_launches(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg: dict[str, int]
                 ) -> tuple[list[tuple[Any, tuple[int], tuple, dict[str, Any]]], torch.Tensor]:
    """moe_align for cfg's BLOCK_M, then the two kernels' launches as (kernel, grid, args,
    kwargs), gate_up first, and the [T * top_k, H] buffer the second fills (one row per
    slot). Separate from running them so a probe can time each kernel alone."""
    num_tokens, hidden_size = hidden.shape
    num_experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    top_k = topk_ids.shape[1]
    num_slots = num_tokens * top_k
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    sorted_ids, block_expert = moe_align(topk_ids, num_experts, block_m)
    num_blocks = block_expert.numel()
    precision = "ieee" if hidden.dtype == torch.float32 else "tf32"
    inter_buf = torch.empty(sorted_ids.numel(), inter, dtype=hidden.dtype, device=hidden.device)
    tma = bool(cfg.get("TMA")) and tma_ok(w13, w2, inter_buf)
    # One program per (row block, column tile), in the order _tile_ids gives them.
    launch = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": cfg["BLOCK_K"],
              "GROUP_M": cfg["GROUP_M"], "PRECISION": precision, "TMA": tma,
              "num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]}
    w13_arg, w2_arg, inter_in = w13, w2, inter_buf
    if tma:
        block_k = cfg["BLOCK_K"]
        w13_arg = TensorDescriptor.from_tensor(w13.view(-1, hidden_size), [block_n, block_k])
        w2_arg = TensorDescriptor.from_tensor(w2.view(-1, inter), [block_n, block_k])
        inter_in = TensorDescriptor.from_tensor(inter_buf, [block_m, block_k])
    gate_up = (_gate_up_kernel, (num_blocks * cdiv(inter, block_n),), (
        hidden, w13_arg, inter_buf, sorted_ids, block_expert, num_slots, num_blocks,
        hidden.stride(0), w13.stride(0), w13.stride(1), w13.stride(2), inter_buf.stride(0)),
        {"TOP_K": top_k, "HIDDEN": hidden_size, "INTER": inter, **launch})
    per_slot = torch.empty(num_slots, hidden_size, dtype=hidden.dtype, device=hidden.device)
    down = (_down_kernel, (num_blocks * cdiv(hidden_size, block_n),), (
        inter_in, w2_arg, per_slot, sorted_ids, block_expert, topk_weights.contiguous(),
        num_slots, num_blocks, inter_buf.stride(0), w2.stride(0), w2.stride(1), w2.stride(2),
        per_slot.stride(0)),
        {"HIDDEN": hidden_size, "INTER": inter, **launch})
    return [gate_up, down], per_slot


def kernel_launches(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                    topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg: dict[str, int]
                    ) -> tuple[list[tuple[Any, tuple[int], tuple, dict[str, Any]]], torch.Tensor]:
    """The launches cfg asks for: the GEMV kernels' (their output is [T, H]) or the grouped
    GEMM's (moe_launches: one row per slot, [T * top_k, H], still to be summed over k)."""
    launch = moe_gemv_launches if cfg["GEMV"] else moe_launches
    return launch(hidden, w13, w2, topk_weights, topk_ids, cfg)


def _fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
               topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg: dict[str, int],
               compile_only: bool = False) -> torch.Tensor | None:
    launches, out = kernel_launches(hidden, w13, w2, topk_weights, topk_ids, cfg)
    for kernel, grid, args, kwargs in launches:
        if compile_only:
            kernel.warmup(*args, grid=grid, **kwargs)
        else:
            kernel[grid](*args, **kwargs)
    if compile_only or cfg["GEMV"]:
        return None if compile_only else out
    return out.view(hidden.shape[0], topk_ids.shape[1], hidden.shape[1]).sum(dim=1)


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
