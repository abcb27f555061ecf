"""The integer-weight GEMV for one to four rows (decode at small batch): y = x @ w^T with w
in `int4_linear`'s packed layout (int32 words, 32 / bits values each, a scale and zero
point a group), on the CUDA cores, float32 throughout.

Why beside the tensor-core tile: each value costs a shift and a mask before any multiply,
and the tile adds moving the values into the dot's operand layout. Here each value is a
shift, a mask, an or (the float32 exponent of 2^23: the float 2^23 + q), one add (less
2^23 + zero: q - zero exactly) and one FMA a row; the cross-thread sums wait for the end.
On an H200 at one row it beat the tile by 8-25% on 8B's projections (qkv 19.5 us against
21.3, gate_up 57.0 against 75.5; benchmarks/results/h200-session45-zzz108-0b314fa/), yet
both stay at 0.12-0.26 of the copy rate; at two rows and more the tile wins, so the op
sends it one row alone (`int4_linear.GEMV_ROWS`). The loop is a plain `range`: Triton's
cp.async pipelining of it (`tl.range(num_stages=...)`) was up to 3.6x slower on an H100
(benchmarks/results/h100-session45-zzz108-220e4a3/):

* program (n, s) owns BLOCK_N weight rows and walks its slice of K (SPLIT_K slices) in
  BLOCK_K steps inside one group (BLOCK_K divides the group): a step loads
  [BLOCK_N, BLOCK_K / P] words, P = 32 / bits values each, and expands them to
  [BLOCK_N, BLOCK_K / P, P] values in registers;
* the M rows of x (M a constexpr, 1..MAX_ROWS; padded to a power of two) times those
  values, summed over each word's P values (in one thread's registers) and times the
  rows' group scales, go to a float32 [M, BLOCK_N, BLOCK_K / P] accumulator, summed
  over the words once at the end: no cross-thread sum, hence no barrier, in the loop;
* SPLIT_K > 1: float32 partials [SPLIT_K, M, N], summed in slice order by
  `int4_linear`'s `_sum_splits_kernel` (deterministic).

The only roundings are float32 sums and the output's one cast.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from loom.kernels.compile_pool import launch_or_compile
from loom.kernels.host import cdiv, sm_count

MAX_ROWS = 4
"""Rows past this take the tensor-core tile: each row here costs an FMA a value."""


@triton.jit
def _int4_gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, stride_x, M: tl.constexpr,
                      N: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr,
                      HAS_ZERO: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    # SPLIT_K 1: out is [M, N] in x's dtype; else the float32 partials [SPLIT_K, M, N].
    PER_WORD: tl.constexpr = 32 // BITS
    WORDS: tl.constexpr = BLOCK_K // PER_WORD
    MASK: tl.constexpr = (1 << BITS) - 1
    MID: tl.constexpr = 1 << (BITS - 1)
    GROUPS: tl.constexpr = K // GROUP
    K_ITERS: tl.constexpr = K // BLOCK_K // SPLIT_K
    M_PAD: tl.constexpr = 1 if M == 1 else (2 if M == 2 else 4)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(rn, N - 1).to(tl.int64)  # clamped, not masked: only the store is
    split = tl.program_id(1)
    k0 = split * (K_ITERS * BLOCK_K)
    words = tl.arange(0, WORDS)
    vpos = tl.arange(0, PER_WORD)
    mrows = tl.arange(0, M_PAD)
    w_ptrs = w_ptr + rows[:, None] * (K // PER_WORD) + (k0 // PER_WORD + words)[None, :]
    # x's step columns, value v of word j at j * P + v, as [BLOCK_N, WORDS, PER_WORD]
    # (the same for every weight row): the weights' own shape, so that each thread holds
    # x for exactly the words it holds, all P values in its registers
    x_cols = (k0 + words * PER_WORD)[None, :, None] + vpos[None, None, :] \
        + 0 * rn[:, None, None]
    shifts = (vpos * BITS).to(tl.uint32)[None, None, :]
    # per row of x, weight row and word: the sums across steps are reduced over the words
    # once, at the end (no cross-thread sum, hence no barrier, in the loop)
    acc = tl.zeros((M_PAD, BLOCK_N, WORDS), dtype=tl.float32)
    for i in range(K_ITERS):
        group = (k0 + i * BLOCK_K) // GROUP
        packed = tl.load(w_ptrs)
        if HAS_ZERO:
            z = tl.load(z_ptr + rows * GROUPS + group).to(tl.float32)
        else:
            z = tl.full((BLOCK_N,), MID, tl.float32)
        s = tl.load(s_ptr + rows * GROUPS + group).to(tl.float32)
        # 0x4B000000 | q is the float32 2^23 + q; less 2^23 + zero: q - zero, exact
        bits = ((packed.to(tl.uint32, bitcast=True)[:, :, None] >> shifts) & MASK) \
            | 0x4B000000
        w = bits.to(tl.float32, bitcast=True) - (8388608.0 + z)[:, None, None]
        for m in tl.static_range(M):
            x = tl.load(x_ptr + m * stride_x + x_cols + i * BLOCK_K).to(tl.float32)
            part = tl.sum(w * x, axis=2) * s[:, None]
            acc += tl.where(mrows[:, None, None] == m, part[None, :, :], 0.0)
        w_ptrs += WORDS
    y = tl.sum(acc, axis=2)  # [M_PAD, BLOCK_N]
    out = (split * M).to(tl.int64) * N + mrows[:, None] * N + rn[None, :]
    tl.store(out_ptr + out, y.to(out_ptr.dtype.element_ty),
             mask=(mrows < M)[:, None] & (rn < N)[None, :])


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


def split_for(steps: int, programs: int, sms: int, waves: int = 4) -> int:
    """The largest divisor of the K steps at most `waves` programs per SM over the
    `programs` the row blocks give (at least 1)."""
    want = max(1, min(steps, round(waves * sms / max(programs, 1))))
    return max(d for d in range(1, want + 1) if steps % d == 0)


@functools.lru_cache(maxsize=1024)  # asked on every call of the op
def default_config(m: int, n: int, k: int, block_k: int, sms: int = 132) -> GemvConfig:
    """block_k: the K step (a divisor of the group), capped at 128 values. The best of an
    H200 search on 8B's projections (benchmarks/results/h200-session45-zzz108-0b314fa/):
    128 rows a program, K split for about four programs per SM."""
    block_k = min(block_k, 128)
    return GemvConfig(128, block_k, split_for(k // block_k, cdiv(n, 128), sms))


def int4_gemv(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
              zero: torch.Tensor | None, group_size: int, bits: int, block_k: int,
              config: GemvConfig | None = None, compile_only: bool = False) -> torch.Tensor:
    """x [M <= MAX_ROWS, K] @ w^T for `int4_linear.supports`' arguments, x's dtype out;
    block_k: the K step where no config is given (a power of two dividing the group).
    compile_only: compiled on `compile_pool`'s threads, nothing run."""
    from loom.kernels.int4_linear import _sum_splits_kernel
    (m, k), n = x.shape, packed.shape[0]
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"int4_gemv: takes 1..{MAX_ROWS} rows, got {m}")
    sms = sm_count(x.device) if x.is_cuda else 132
    cfg = config or default_config(m, n, k, block_k, sms)
    if group_size % cfg.block_k or (k // cfg.block_k) % cfg.split_k:
        raise ValueError(f"int4_gemv: block_k {cfg.block_k} must divide the group "
                         f"{group_size} and split_k {cfg.split_k} the K steps")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    split = cfg.split_k
    dest = out if split == 1 else torch.empty(split, m, n, dtype=torch.float32,
                                               device=x.device)
    launch_or_compile(_int4_gemv_kernel, (cdiv(n, cfg.block_n), split), compile_only)(
        x, packed, scale, packed if zero is None else zero, dest, x.stride(0), M=m, N=n,
        K=k, GROUP=group_size, HAS_ZERO=zero is not None, BITS=bits, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, SPLIT_K=split, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages)
    if split > 1:
        block = 1024
        launch_or_compile(_sum_splits_kernel, (cdiv(m * n, block),), compile_only)(
            dest, out, m * n, SPLIT_K=split, BLOCK=block, num_warps=4)
    return out
