"""y = x @ W^T + b for a single token (M = 1): a matrix-vector product over the weight.

At M = 1 a linear layer reads its whole weight to do two FLOPs per element, so its floor is
the weight's bytes over memory bandwidth. cuBLAS reaches it on the large projections of a
Llama-3.1-8B decode step (gate_up 4.2 TB/s on an H200) but not on the smaller ones. Profile at
94c6b95, per layer: QKV 16.1 us (3.1 TB/s), o_proj 10.8 us plus a 1.7 us split-K reduction
kernel; at TP=2, QKV 2.7 TB/s and o_proj 2.5 TB/s. Here each program owns BLOCK_N output
features and streams their rows of W over the whole K in BLOCK_K slices, so no split-K pass
is needed; the tile shape is autotuned per (N, K) on the device at first use.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CONFIGS = [
    triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s)
    for n, k, w, s in [
        (4, 1024, 4, 3), (8, 512, 4, 3), (8, 1024, 8, 3), (16, 256, 4, 3),
        (16, 512, 4, 4), (16, 512, 8, 3), (16, 1024, 8, 2), (32, 256, 4, 3),
        (32, 256, 8, 4), (32, 512, 8, 3), (64, 128, 4, 4), (64, 256, 8, 3),
    ]
]


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, N, stride_wn,
                 K: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_wn
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        w = tl.load(w_rows + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                    other=0.0).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    if HAS_BIAS:
        acc += tl.load(b_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, acc.to(out_ptr.dtype.element_ty), mask=row_ok)


_tuned = None


def _autotuned():
    global _tuned
    if _tuned is None:
        # Short timing runs: a shape's ~12 candidates are timed once, while warming up.
        _tuned = triton.autotune(CONFIGS, key=["N", "K"], warmup=5, rep=20)(_gemv_kernel)
    return _tuned


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         block_n: int | None = None, block_k: int | None = None) -> torch.Tensor:
    """x [1, K], weight [N, K] (rows contiguous), bias [N] or None -> [1, N] in x's dtype.

    block_n/block_k fix the tile; by default it is autotuned per shape on CUDA, and fixed in
    Triton's CPU interpreter, which cannot time candidates.
    """
    if x.dim() != 2 or x.shape[0] != 1 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"gemv: needs x [1, K] and weight [N, K], got {tuple(x.shape)} and "
                         f"{tuple(weight.shape)}")
    if weight.stride(1) != 1:
        raise ValueError("gemv: weight rows must be contiguous")
    n, k = weight.shape
    x = x.contiguous()
    out = torch.empty(1, n, dtype=x.dtype, device=x.device)
    args = (x, weight, bias if bias is not None else weight, out, n, weight.stride(0))
    if (block_n is None or block_k is None) and not x.is_cuda:
        block_n, block_k = 16, 64  # the interpreter: a fixed tile
    if block_n is None or block_k is None:
        _autotuned()[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]),)](
            *args, K=k, HAS_BIAS=bias is not None)
    else:
        _gemv_kernel[(triton.cdiv(n, block_n),)](
            *args, K=k, HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k)
    return out
