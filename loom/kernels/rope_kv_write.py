"""Rotary embedding and the KV-cache write in one kernel.

At decode, rotating q/k and writing k/v are each a launch over a few kilobytes, so launch
and ramp-up dominate both; fused they cost one. The rotation is the rotate-half one of
`loom.layers.rotary`, with its float32 `cos_sin_cache` ([max_pos, head_dim] = cat(cos, sin)):
the same float32 products and sums, rounded back to the input dtype, so the rotated q and
the cached k match the unfused path. The cache layout is that of `kv_write`.

Given a per-head RMSNorm of q and k (`loom.layers.norm.QKNorm`, Qwen3's q_norm / k_norm),
the kernel normalises each head before rotating it, rounding where `rms_norm` rounds, so a
compiled graph runs no norm kernels of its own for them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels.host import cdiv, next_power_of_2
from loom.kernels.launch import fast_launch
from loom.kernels.kv_write import check_slot_layout, saturation, to_cache


@triton.jit
def rms_scale(x, rstd, w_ptr, w_off, w_ok, elem: tl.constexpr):
    """x [R, C] (float32) times its rows' rstd [R, 1] and the norm weights at w_ptr + w_off,
    returned in float32 and rounded as `loom.layers.norm.rms_norm` rounds: x * rstd to
    elem, then times the weight to elem again."""
    w = tl.load(w_ptr + w_off, mask=w_ok, other=0.0).to(tl.float32)
    return (w * (x * rstd).to(elem).to(tl.float32)).to(elem).to(tl.float32)


@triton.jit
def rotate_half_rows(x_ptr, offs, dims, ok, cos_sin_row, norm_ptr, norm_eps,
                     HEAD_DIM: tl.constexpr, NORM: tl.constexpr):
    """Rotary (rotate-half) of the rows at x_ptr + offs [R, HEAD_DIM] at one position, for
    the decode kernel's fused rotary, as _rope_kv_write_kernel computes it: float32
    products and sums, rounded to the input's dtype. Element d pairs with d + D/2 (or
    d - D/2): x * cos - partner * sin below the half, x * cos + partner * sin above it.
    NORM: each row is first RMS-normalised with the weights at norm_ptr (a per-head q/k
    norm), as the kernel below does it."""
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


@triton.jit
def _norm_halves(x1, x2, w_ptr, dim, dim_ok, eps, elem: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Per-head RMSNorm of rows held as their two halves [R, HALF_BLOCK] (lanes past the
    half are 0)."""
    half: tl.constexpr = HEAD_DIM // 2
    ss = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
    rstd = tl.math.rsqrt(ss / HEAD_DIM + eps)[:, None]
    return (rms_scale(x1, rstd, w_ptr, dim[None, :], dim_ok[None, :], elem),
            rms_scale(x2, rstd, w_ptr, half + dim[None, :], dim_ok[None, :], elem))


@triton.jit
def _rope_kv_write_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, cache_ptr, positions_ptr, cos_sin_ptr, slot_mapping_ptr,
    kv_out_ptr, q_norm_ptr, k_norm_ptr, norm_eps,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_pos, stride_plane, stride_slot, stride_chead,
    stride_kvo_plane, stride_kvo_t, stride_kvo_h,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEADS: tl.constexpr, HALF_BLOCK: tl.constexpr, WRITE_KV_OUT: tl.constexpr,
    SAT: tl.constexpr, QK_NORM: tl.constexpr = False,
):
    # Program (token, group): the first groups take HEADS query heads each, the rest HEADS
    # key heads (and their values). Spreading one token's heads over a few programs keeps
    # a batch of one from running on a single SM.
    token = tl.program_id(0)
    group = tl.program_id(1)
    num_q_groups: tl.constexpr = (NUM_Q_HEADS + HEADS - 1) // HEADS
    half: tl.constexpr = HEAD_DIM // 2
    dim = tl.arange(0, HALF_BLOCK)
    dim_ok = dim < half
    pos = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cos_sin_ptr + pos * stride_pos + dim, mask=dim_ok)[None, :]
    sin = tl.load(cos_sin_ptr + pos * stride_pos + half + dim, mask=dim_ok)[None, :]
    row = token.to(tl.int64)
    if group < num_q_groups:
        head = group * HEADS + tl.arange(0, HEADS)
        ok = (head < NUM_Q_HEADS)[:, None] & dim_ok[None, :]
        src = q_ptr + row * stride_qt + head[:, None] * stride_qh + dim[None, :]
        x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(src + half, mask=ok, other=0.0).to(tl.float32)
        if QK_NORM:
            x1, x2 = _norm_halves(x1, x2, q_norm_ptr, dim, dim_ok, norm_eps,
                                  q_ptr.dtype.element_ty, HEAD_DIM)
        dst = q_out_ptr + row * stride_ot + head[:, None] * stride_oh + dim[None, :]
        elem = q_out_ptr.dtype.element_ty
        tl.store(dst, (x1 * cos - x2 * sin).to(elem), mask=ok)
        tl.store(dst + half, (x2 * cos + x1 * sin).to(elem), mask=ok)
    else:
        slot = tl.load(slot_mapping_ptr + token)
        if slot >= 0:  # slot < 0: a padding row, nothing to store
            head = (group - num_q_groups) * HEADS + tl.arange(0, HEADS)
            ok = (head < NUM_KV_HEADS)[:, None] & dim_ok[None, :]
            src = k_ptr + row * stride_kt + head[:, None] * stride_kh + dim[None, :]
            x1 = tl.load(src, mask=ok, other=0.0).to(tl.float32)
            x2 = tl.load(src + half, mask=ok, other=0.0).to(tl.float32)
            if QK_NORM:
                x1, x2 = _norm_halves(x1, x2, k_norm_ptr, dim, dim_ok, norm_eps,
                                      k_ptr.dtype.element_ty, HEAD_DIM)
            # int64 slot arithmetic: slot * stride overflows int32 beyond 2 G cache elements.
            dst = cache_ptr + slot.to(tl.int64) * stride_slot + head[:, None] * stride_chead \
                + dim[None, :]
            # Rounded to the key's dtype first, as the unrotated path stores a rotated key.
            key_ty = k_ptr.dtype.element_ty
            elem = cache_ptr.dtype.element_ty
            k1 = (x1 * cos - x2 * sin).to(key_ty)
            k2 = (x2 * cos + x1 * sin).to(key_ty)
            tl.store(dst, to_cache(k1, elem, SAT), mask=ok)
            tl.store(dst + half, to_cache(k2, elem, SAT), mask=ok)
            src_v = v_ptr + row * stride_vt + head[:, None] * stride_vh + dim[None, :]
            v1 = tl.load(src_v, mask=ok)
            v2 = tl.load(src_v + half, mask=ok)
            tl.store(dst + stride_plane, to_cache(v1, elem, SAT), mask=ok)
            tl.store(dst + stride_plane + half, to_cache(v2, elem, SAT), mask=ok)
            if WRITE_KV_OUT:  # the batch's own rotated keys and values, for its attention
                out = kv_out_ptr + row * stride_kvo_t + head[:, None] * stride_kvo_h \
                    + dim[None, :]
                tl.store(out, k1, mask=ok)
                tl.store(out + half, k2, mask=ok)
                tl.store(out + stride_kvo_plane, v1, mask=ok)
                tl.store(out + stride_kvo_plane + half, v2, mask=ok)


def rope_write_kv_cache(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                        kv_cache: torch.Tensor, slot_mapping: torch.Tensor,
                        out: torch.Tensor | None = None,
                        heads_per_program: int | None = None,
                        kv_out: torch.Tensor | None = None,
                        qk_norm: tuple[torch.Tensor, torch.Tensor, float] | None = None
                        ) -> torch.Tensor:
    """Rotate query [T, Hq, D] and key [T, Hkv, D] at positions[:T]; store the rotated key
    and value at slot_mapping[:T] (slots < 0 are skipped); return the rotated query, in out
    or else a new [T, Hq, D] tensor (padding rows are rotated too).

    query/key/value may be strided views (e.g. slices of a fused QKV output) as long as the
    head dim is contiguous. heads_per_program: None sizes a program at about 1k elements.
    kv_out [2, T, Hkv, D] (key's dtype), when given, also receives the rotated key and the
    value of every row with a slot (a fresh prefill attends over them without reading the
    cache back). qk_norm: (q_weight, k_weight, eps) (`loom.layers.norm.QKNorm`): q and k
    are each normalised per head first, as `QKNorm.apply` would.
    """
    num_tokens, num_q_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    q_out = out if out is not None else torch.empty(query.shape, dtype=query.dtype,
                                                    device=query.device)
    if num_tokens == 0:
        return q_out
    if head_dim % 2:
        raise ValueError(f"rotary needs an even head dim, got {head_dim}")
    if any(t.stride(2) != 1 for t in (query, key, value, q_out)):
        raise ValueError("rope_write_kv_cache needs a contiguous head dim in every head tensor")
    check_slot_layout(kv_cache, "rope_write_kv_cache")
    if cos_sin_cache.dtype != torch.float32 or cos_sin_cache.shape[-1] != head_dim \
            or cos_sin_cache.stride(1) != 1:
        raise ValueError("cos_sin_cache must be float32 [max_pos, head_dim], rows contiguous")
    if heads_per_program is not None and heads_per_program & (heads_per_program - 1):
        raise ValueError(f"heads_per_program must be a power of two, got {heads_per_program}")
    half_block = next_power_of_2(head_dim // 2)
    heads = heads_per_program or min(next_power_of_2(max(num_q_heads, num_kv_heads)),
                                     max(1, 512 // half_block))
    groups = cdiv(num_q_heads, heads) + cdiv(num_kv_heads, heads)
    if kv_out is not None and (kv_out.shape != (2,) + tuple(key.shape)
                               or kv_out.dtype != key.dtype or kv_out.stride(3) != 1):
        raise ValueError(f"kv_out must be [2, {num_tokens}, {num_kv_heads}, {head_dim}] of "
                         f"{key.dtype} with a contiguous head dim, got {tuple(kv_out.shape)} "
                         f"{kv_out.dtype}")
    kv_strides = (kv_out.stride(0), kv_out.stride(1), kv_out.stride(2)) if kv_out is not None \
        else (0, 0, 0)
    q_norm, k_norm, eps = check_qk_norm(qk_norm, query, key, "rope_write_kv_cache")
    fast_launch(_rope_kv_write_kernel, (num_tokens, groups))(
        query, key, value, q_out, kv_cache, positions, cos_sin_cache, slot_mapping,
        kv_out if kv_out is not None else q_out, q_norm, k_norm, eps,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1),
        value.stride(0), value.stride(1), q_out.stride(0), q_out.stride(1),
        cos_sin_cache.stride(0), kv_cache.stride(0), kv_cache.stride(2), kv_cache.stride(3),
        *kv_strides,
        NUM_Q_HEADS=num_q_heads, NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEADS=heads, HALF_BLOCK=half_block, WRITE_KV_OUT=kv_out is not None,
        SAT=saturation(kv_cache), QK_NORM=qk_norm is not None,
    )
    return q_out


def check_qk_norm(qk_norm, query: torch.Tensor, key: torch.Tensor,
                  caller: str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(q_weight, k_weight, eps) for a kernel's arguments; the weights must be contiguous
    [head_dim] of the heads' dtype. Without a norm: placeholders the kernel never reads."""
    if qk_norm is None:
        return query, query, 0.0
    q_weight, k_weight, eps = qk_norm
    head_dim = query.shape[-1]
    for name, w in (("q", q_weight), ("k", k_weight)):
        if w.shape != (head_dim,) or w.stride(0) != 1 or w.dtype != query.dtype \
                or w.device != query.device:
            raise ValueError(f"{caller}: the {name} norm weight must be a contiguous "
                             f"[{head_dim}] {query.dtype} tensor on {query.device}, got "
                             f"{tuple(w.shape)} {w.dtype} on {w.device}")
    if key.dtype != query.dtype:
        raise ValueError(f"{caller}: q/k norm needs query and key of one dtype")
    return q_weight, k_weight, float(eps)
