"""Scatter this step's keys and values into the paged KV cache.

Cache layout per layer: `[2, num_blocks, block_size, num_kv_heads, head_dim]`; a token's
slot is `block_id * block_size + offset`, so (block, offset) collapse into one slot index
when the two inner dims of the block are contiguous, which the wrapper checks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels.host import next_power_of_2
from loom.kernels.launch import fast_launch


@triton.jit
def to_cache(x, elem: tl.constexpr, SAT: tl.constexpr):
    """x as the cache's element type; SAT > 0 (an 8-bit cache, `saturation`) clamps it to
    +-SAT first, so that a large value is stored as the largest one, not as inf or NaN."""
    if SAT > 0:
        x = tl.minimum(tl.maximum(x.to(tl.float32), -SAT), SAT)
    return x.to(elem)


def saturation(kv_cache: torch.Tensor) -> float:
    """The SAT of `to_cache` for this cache: its dtype's largest value if 8-bit, else 0."""
    return float(torch.finfo(kv_cache.dtype).max) if kv_cache.element_size() == 1 else 0.0


@triton.jit
def _kv_write_kernel(
    key_ptr, value_ptr, cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_plane, stride_slot, stride_chead,
    HEAD_DIM: tl.constexpr, NUM_KV_HEADS: tl.constexpr, BLOCK: tl.constexpr,
    SAT: tl.constexpr,
):
    # One program per token: all its heads in one vector, so a tiny decode batch still
    # issues wide, coalesced stores instead of one short store per head.
    token = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + token)
    if slot < 0:  # padding row (CUDA-graph or TP padding): nothing to store
        return
    idx = tl.arange(0, BLOCK)
    ok = idx < NUM_KV_HEADS * HEAD_DIM
    head = idx // HEAD_DIM
    dim = idx % HEAD_DIM
    src_k = key_ptr + token.to(tl.int64) * stride_kt + head * stride_kh + dim
    src_v = value_ptr + token.to(tl.int64) * stride_vt + head * stride_vh + dim
    # int64 slot arithmetic: slot * stride overflows int32 for caches beyond 2 G elements.
    dst = cache_ptr + slot.to(tl.int64) * stride_slot + head * stride_chead + dim
    elem = cache_ptr.dtype.element_ty
    tl.store(dst, to_cache(tl.load(src_k, mask=ok), elem, SAT), mask=ok)
    tl.store(dst + stride_plane, to_cache(tl.load(src_v, mask=ok), elem, SAT), mask=ok)


def check_slot_layout(kv_cache: torch.Tensor, caller: str) -> None:
    """A slot index addresses (block, offset) only if each block's slots are contiguous."""
    if kv_cache.stride(4) != 1 or kv_cache.stride(1) != kv_cache.stride(2) * kv_cache.shape[2]:
        raise ValueError(f"{caller} needs each cache block contiguous in its slots")


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Store key/value [T, num_kv_heads, head_dim] at slot_mapping[:T]; slots < 0 are skipped.

    key/value may be strided views (e.g. slices of a fused QKV output) as long as the
    head dim is contiguous.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    if key.stride(2) != 1 or value.stride(2) != 1:
        raise ValueError("write_kv_cache needs a contiguous head dim in key and value")
    check_slot_layout(kv_cache, "write_kv_cache")
    fast_launch(_kv_write_kernel, (num_tokens,))(
        key, value, kv_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        kv_cache.stride(0), kv_cache.stride(2), kv_cache.stride(3),
        HEAD_DIM=head_dim, NUM_KV_HEADS=num_kv_heads,
        BLOCK=next_power_of_2(num_kv_heads * head_dim), SAT=saturation(kv_cache),
    )
