"""The LoRA term at decode rows in two kernels (`loom.lora.layers` has the maths):

    out = y + ((x A^T) * mask) B^T          for 1..16 rows

Through torch it was four kernels a projection (x A^T, the slot mask, h B^T, the add into
y), each a launch at batch 1 where its bytes are a few hundred kilobytes; on Llama-3.1-8B
with one rank-16 adapter that made decode 46% slower (run_zzz96). Here:

* shrink: program (s, w) sums its slice s of K for BLOCK_W columns of h = x A^T (rows
  padded to 16 for the tensor cores) and stores the float32 partial [SPLITS, M, W]. K is
  split so that the ~100 KB - 1 MB of A streams through several SMs at once.
* expand: every program sums the partials (a few KB from L2), applies the slot mask, and
  multiplies its BLOCK_N rows of B, adding y: out = y + h B^T, in one pass over B.

The input may come as its producer's inputs, so that the kernel that makes it need not
run (the decode GEMV pass hands them over): `silu_mul` (x = [gate | up], the input is
silu(gate) * up, as torch's eager ops round it) or `norm_weight` (x = the residual sum h,
the input is RMSNorm(h) * weight: h times the weight is multiplied, and each row's sums
are scaled by its 1 / RMS once every slice is summed). Everything accumulates in float32;
h is rounded to the dtype before the expand, as the reference's F.linear rounds it, and
y + h B^T once at the end.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels.gemv_config import MAX_M
from loom.kernels.host import cdiv, next_power_of_2
from loom.kernels.silu_mul import silu_mul_values

MAX_WIDTH = 256
"""The widest h (slices x slots x rank) the kernels take: the expand holds a [BLOCK_N,
width] tile of B. Wider (4 slots of rank 64 on q/k/v, say) runs through torch."""

MAX_SPLITS = 16
"""Most slices of K: each expand program sums SPLITS partials of h."""

_ROWS = MAX_M  # the rows, padded to one tensor-core tile (16)


@triton.jit
def _shrink_kernel(x_ptr, nw_ptr, a_ptr, part_ptr, ss_ptr, M, W, stride_x,
                   K: tl.constexpr, MODE: tl.constexpr, ROWS: tl.constexpr,
                   BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, K_ITERS: tl.constexpr,
                   DOT_PRECISION: tl.constexpr):
    # MODE: 0 x as given, 1 silu(gate) * up of x = [gate | up], 2 x the residual sum of
    # an RMSNorm (its weight at nw_ptr; the squares go to ss [SPLITS, M]).
    split = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    rows = tl.arange(0, ROWS)
    elem = a_ptr.dtype.element_ty
    acc = tl.zeros([ROWS, BLOCK_W], dtype=tl.float32)
    squares = tl.zeros([ROWS], dtype=tl.float32)
    for i in tl.static_range(K_ITERS):
        ks = (split * K_ITERS + i) * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        x_ok = (rows < M)[:, None] & k_ok[None, :]
        x_ptrs = x_ptr + rows[:, None] * stride_x + ks[None, :]
        xt = tl.load(x_ptrs, mask=x_ok, other=0.0)
        if MODE == 1:
            xt = silu_mul_values(xt, tl.load(x_ptrs + K, mask=x_ok, other=0.0), elem)
        if MODE == 2:
            h = xt.to(tl.float32)
            squares += tl.sum(h * h, axis=1)
            xt = h * tl.load(nw_ptr + ks, mask=k_ok, other=0.0).to(tl.float32)[None, :]
        a = tl.load(a_ptr + cols[:, None] * K + ks[None, :],
                    mask=(cols < W)[:, None] & k_ok[None, :], other=0.0)
        acc += tl.dot(xt.to(elem), tl.trans(a), input_precision=DOT_PRECISION)
    out_ok = (rows < M)[:, None] & (cols < W)[None, :]
    tl.store(part_ptr + split * M * W + rows[:, None] * W + cols[None, :], acc, mask=out_ok)
    if MODE == 2:
        tl.store(ss_ptr + split * M + rows, squares, mask=(rows < M) & (tl.program_id(1) == 0))


@triton.jit
def _expand_kernel(part_ptr, ss_ptr, mask_ptr, b_ptr, y_ptr, out_ptr, M, N, W, slot_width,
                   stride_mask, stride_y, eps, K: tl.constexpr, NORM: tl.constexpr,
                   SPLITS: tl.constexpr, ROWS: tl.constexpr, BLOCK_W: tl.constexpr,
                   BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_W)
    h_ok = (rows < M)[:, None] & (cols < W)[None, :]
    h_off = rows[:, None] * W + cols[None, :]
    h = tl.zeros([ROWS, BLOCK_W], dtype=tl.float32)
    for s in tl.static_range(SPLITS):
        h += tl.load(part_ptr + s * M * W + h_off, mask=h_ok, other=0.0)
    if NORM:
        squares = tl.zeros([ROWS], dtype=tl.float32)
        for s in tl.static_range(SPLITS):
            squares += tl.load(ss_ptr + s * M + rows, mask=rows < M, other=0.0)
        h *= tl.math.rsqrt(squares / K + eps)[:, None]
    elem = b_ptr.dtype.element_ty
    # x A^T rounded as F.linear's output, then each row keeps its own slot's columns.
    slot = tl.load(mask_ptr + rows[:, None] * stride_mask + (cols % slot_width)[None, :],
                   mask=h_ok, other=0.0)
    h = (h.to(elem).to(tl.float32) * slot.to(tl.float32)).to(elem)
    ns = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.load(b_ptr + ns[:, None] * W + cols[None, :],
                mask=(ns < N)[:, None] & (cols < W)[None, :], other=0.0)
    term = tl.dot(h, tl.trans(b), input_precision=DOT_PRECISION)
    y_ok = (rows < M)[:, None] & (ns < N)[None, :]
    y = tl.load(y_ptr + rows[:, None] * stride_y + ns[None, :], mask=y_ok, other=0.0)
    out = y.to(tl.float32) + term  # rounded once, as the torch path's addmm
    tl.store(out_ptr + rows[:, None] * N + ns[None, :], out.to(out_ptr.dtype.element_ty),
             mask=y_ok)


def supports(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             mask: torch.Tensor) -> bool:
    """Whether `lora_add` takes these: 1..MAX_M rows, h at most MAX_WIDTH wide, one dtype,
    rows contiguous."""
    m, dtype = x.shape[0], a.dtype
    return (1 <= m <= MAX_M and a.shape[0] <= MAX_WIDTH and x.dim() == 2
            and x.dtype == y.dtype == b.dtype == mask.dtype == dtype
            and x.is_contiguous() and a.is_contiguous() and b.is_contiguous()
            and y.stride(-1) == 1 and mask.stride(-1) == 1)


def lora_add(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             mask: torch.Tensor, *, norm_weight: torch.Tensor | None = None,
             eps: float = 0.0, silu_mul: bool = False) -> torch.Tensor:
    """y + ((input A^T) * mask[:M] per slice) B^T for `supports`' arguments: y [M, N], a
    [W, K], b [N, W], mask [>= M, slot_width] (W a multiple of it: one slot block per
    slice). The input is x [M, K], or silu(gate) * up of x [M, 2K] (silu_mul), or
    RMSNorm(x) * norm_weight ([K], eps). Returns a new [M, N] tensor; y is unchanged."""
    m, (w, k), n = x.shape[0], a.shape, b.shape[0]
    block_k = min(128, max(16, next_power_of_2(k)))
    chunks = cdiv(k, block_k)
    k_iters = cdiv(chunks, MAX_SPLITS)
    splits = cdiv(chunks, k_iters)
    block_w = max(16, next_power_of_2(w))
    shrink_w = min(64, block_w)
    part = torch.empty((splits, m, w), dtype=torch.float32, device=x.device)
    squares = torch.empty((splits, m), dtype=torch.float32, device=x.device) \
        if norm_weight is not None else part
    precision = "ieee" if a.dtype == torch.float32 else "tf32"
    mode = 1 if silu_mul else (2 if norm_weight is not None else 0)
    _shrink_kernel[(splits, cdiv(w, shrink_w))](
        x, x if norm_weight is None else norm_weight, a, part, squares, m, w, x.stride(0),
        K=k, MODE=mode, ROWS=_ROWS, BLOCK_W=shrink_w, BLOCK_K=block_k, K_ITERS=k_iters,
        DOT_PRECISION=precision, num_warps=4)
    out = torch.empty((m, n), dtype=y.dtype, device=y.device)
    block_n = 64 if block_w <= 128 else 32
    _expand_kernel[(cdiv(n, block_n),)](
        part, squares, mask, b, y, out, m, n, w, mask.shape[1], mask.stride(0), y.stride(0),
        float(eps), K=k, NORM=norm_weight is not None, SPLITS=splits, ROWS=_ROWS,
        BLOCK_W=block_w, BLOCK_N=block_n, DOT_PRECISION=precision, num_warps=4)
    return out

