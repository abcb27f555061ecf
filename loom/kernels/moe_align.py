"""The fused MoE's slot alignment: sort each (token, k) slot by its expert and pad every
expert's run to a multiple of BLOCK_M, so that every BLOCK_M rows of the sorted order
belong to one expert and the grouped GEMM (loom/kernels/moe_gemm.py) can treat them as one
dense tile. Two small Triton kernels sized by an upper bound: no host sync, and launch
shapes that depend on T, top_k and E alone (CUDA-graph friendly).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom import envs
from loom.kernels.host import cdiv, next_power_of_2


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
