"""The integer-weight GEMV for one to four rows (decode at small batch; the op sends it one
and two): y = x @ w^T with w in `int4_linear`'s packed layout (int32 words, 32 / bits
values each, a scale and zero point a group), on the CUDA cores, float32 throughout.

Why beside the tensor-core tile: at one row the tile wastes 15 of its 16 rows and moves
every value into the dot's operand layout. Here the values never leave the registers they
were loaded into, and each costs about two instructions before its one FMA a row:

* a value q goes into a float32's mantissa under the exponent of 128, which is the float
  128 + q exactly (4 bits: bits 16..19; 8 bits: bits 15..22, 128 + q / 2); 4 bits take
  one `prmt` a value from words masked to one value a byte (CONV 1, CUDA only: inline
  PTX), or a shift and one `lop3` (CONV 0: any width, and Triton's interpreter). The
  exponent's bits come in as a runtime argument, so that ptxas folds mask and or into one
  lop3 (two immediates would not fit one);
* the products (128 + q) x are exact, their sums float32; the zero point and the 128 come
  off once a word a step: sum (q - z) x = sum (128 + q) x - (128 + z) sum x, where sum x
  is the same for every weight row. The cancellation costs ~4 of float32's 24 bits,
  still ~2^-19 relative, far below the output's rounding in bf16/fp16.

Layout: program (n, s) owns BLOCK_N weight rows and walks its slice of K (SPLIT_K
slices) in BLOCK_K steps: inside one group, or over GS whole groups (then each row is
read in longer runs, which is what made the one-row default 8 rows x 256 values on one
warp). A step loads [BLOCK_N, GS, WG] words (P = 32 / bits values each, WG words a
scale). Each row of x has its own accumulators of that shape (M a constexpr,
1..MAX_ROWS), summed once, at the end: no cross-thread sum, hence no barrier, in the loop.
PREFETCH 1 loads the next step's words before this step's arithmetic (no gain measured).
SPLIT_K > 1: float32 partials [SPLIT_K, M, N], summed in slice order by `int4_linear`'s
`sum_splits` (deterministic).

On an H100 (benchmarks/results/h100-session46-zzz11[012]-*/) one row takes 0.65-0.79x
session 45's GEMV's time (which had a shared-memory layout change and ten barriers a
step), 0.23-0.52 of the copy rate; the search's landscape was flat in the instructions
(prmt or shift within noise), so what bounds it now is the loads' latency and locality,
not the arithmetic.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from loom.kernels.compile_pool import launch_or_compile
from loom.kernels.host import cdiv, is_power_of_2, sm_count

MAX_ROWS = 4
"""Rows past this take the tensor-core tile: each row here costs an FMA a value."""
EXPONENT_128 = 0x43000000
"""The float32 128.0's bits, the exponent every value is put under."""


@triton.jit
def _prmt(a, b, J: tl.constexpr):
    """Byte J of a in byte 2, under b's byte 3, above b's zero bytes 0 and 1 (`prmt`)."""
    if J == 0:
        out = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7044;", "=r,r,r", [a, b],
                                        dtype=tl.uint32, is_pure=True, pack=1)
    elif J == 1:
        out = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7144;", "=r,r,r", [a, b],
                                        dtype=tl.uint32, is_pure=True, pack=1)
    elif J == 2:
        out = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7244;", "=r,r,r", [a, b],
                                        dtype=tl.uint32, is_pure=True, pack=1)
    else:
        out = tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, 0x7344;", "=r,r,r", [a, b],
                                        dtype=tl.uint32, is_pure=True, pack=1)
    return out


@triton.jit
def _value(packed, lo, hi, exponent, V: tl.constexpr, BITS: tl.constexpr,
           CONV: tl.constexpr):
    """Value V of each word as the float32 128 + q (8 bits: 128 + q / 2)."""
    if CONV == 1:  # 4 bits: lo / hi hold the even / odd values, one a byte
        bits = _prmt(lo if V % 2 == 0 else hi, exponent + tl.zeros_like(lo), V // 2)
    else:
        POS: tl.constexpr = 16 if BITS == 4 else 15
        MASK: tl.constexpr = ((1 << BITS) - 1) << POS
        if V * BITS <= POS:
            bits = ((packed << (POS - V * BITS)) & MASK) | exponent
        else:
            bits = ((packed >> (V * BITS - POS)) & MASK) | exponent
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _row_fma(p, xsum, f, x_ptrs):
    x = tl.load(x_ptrs).to(tl.float32)
    return p + f * x[None, :, :], xsum + x


@triton.jit
def _close_step(acc, p, xsum, c, s):
    # sum (q - z) x = (sum (128 + q u) x - (128 + z u) sum x) / u, s holding the 1 / u
    return acc + (p - c * xsum[None, :, :]) * s


@triton.jit
def _store_row(out_ptrs, acc, ok):
    y = tl.sum(tl.sum(acc, axis=2), axis=1)
    tl.store(out_ptrs, y.to(out_ptrs.dtype.element_ty), mask=ok)


@triton.jit
def _int4_gemv_kernel(x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, stride_x, exponent,
                      M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr,
                      HAS_ZERO: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, CONV: tl.constexpr,
                      PREFETCH: tl.constexpr):
    # SPLIT_K 1: out is [M, N] in x's dtype; else the float32 partials [SPLIT_K, M, N].
    # A step: [BLOCK_N, GS, WG] words, GS groups (or 1, a part of one) of WG words each.
    PER_WORD: tl.constexpr = 32 // BITS
    CHUNK: tl.constexpr = GROUP if BLOCK_K > GROUP else BLOCK_K  # values of one scale
    GS: tl.constexpr = BLOCK_K // CHUNK
    WG: tl.constexpr = CHUNK // PER_WORD
    UNIT: tl.constexpr = 1.0 if BITS == 4 else 0.5  # a unit of q in the float 128 + q
    GROUPS: tl.constexpr = K // GROUP
    K_ITERS: tl.constexpr = K // BLOCK_K // SPLIT_K
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(rn, N - 1).to(tl.int64)  # clamped, not masked: only the store is
    split = tl.program_id(1)
    k0 = split * (K_ITERS * BLOCK_K)
    chunks = tl.arange(0, GS)
    words = chunks[:, None] * WG + tl.arange(0, WG)[None, :]  # [GS, WG], in the step
    w_ptrs = w_ptr + rows[:, None, None] * (K // PER_WORD) + (k0 // PER_WORD + words)[None]
    g_ptrs = rows[:, None] * GROUPS + ((k0 + chunks * CHUNK) // GROUP)[None, :]
    x_ptrs = x_ptr + k0 + words * PER_WORD  # value 0 of each word's columns
    acc0 = tl.zeros((BLOCK_N, GS, WG), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_N, GS, WG), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK_N, GS, WG), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_N, GS, WG), dtype=tl.float32)
    nxt = tl.load(w_ptrs).to(tl.uint32, bitcast=True)
    for i in range(K_ITERS):
        if PREFETCH:  # the next step's words (the first again at the last step)
            packed = nxt
            nxt = tl.load(w_ptrs + ((i + 1) % K_ITERS) * (BLOCK_K // PER_WORD)).to(
                tl.uint32, bitcast=True)
        else:
            packed = tl.load(w_ptrs + i * (BLOCK_K // PER_WORD)).to(tl.uint32, bitcast=True)
        group = (i * BLOCK_K) // GROUP
        if HAS_ZERO:
            z = tl.load(z_ptr + g_ptrs + group).to(tl.float32)
        else:
            z = tl.full((BLOCK_N, GS), 1 << (BITS - 1), tl.float32)
        c = (128.0 + z * UNIT)[:, :, None]
        s = (tl.load(s_ptr + g_ptrs + group).to(tl.float32) / UNIT)[:, :, None]
        lo = packed & 0x0F0F0F0F  # prmt's sources (CONV 1; unused, so dropped, else)
        hi = (packed >> 4) & 0x0F0F0F0F
        p0 = tl.zeros((BLOCK_N, GS, WG), dtype=tl.float32)
        p1 = tl.zeros((BLOCK_N, GS, WG), dtype=tl.float32)
        p2 = tl.zeros((BLOCK_N, GS, WG), dtype=tl.float32)
        p3 = tl.zeros((BLOCK_N, GS, WG), dtype=tl.float32)
        xs0 = tl.zeros((GS, WG), dtype=tl.float32)
        xs1 = tl.zeros((GS, WG), dtype=tl.float32)
        xs2 = tl.zeros((GS, WG), dtype=tl.float32)
        xs3 = tl.zeros((GS, WG), dtype=tl.float32)
        xi = x_ptrs + i * BLOCK_K
        for v in tl.static_range(PER_WORD):
            f = _value(packed, lo, hi, exponent, v, BITS, CONV)
            p0, xs0 = _row_fma(p0, xs0, f, xi + v)
            if M > 1:
                p1, xs1 = _row_fma(p1, xs1, f, xi + stride_x + v)
            if M > 2:
                p2, xs2 = _row_fma(p2, xs2, f, xi + 2 * stride_x + v)
            if M > 3:
                p3, xs3 = _row_fma(p3, xs3, f, xi + 3 * stride_x + v)
        acc0 = _close_step(acc0, p0, xs0, c, s)
        if M > 1:
            acc1 = _close_step(acc1, p1, xs1, c, s)
        if M > 2:
            acc2 = _close_step(acc2, p2, xs2, c, s)
        if M > 3:
            acc3 = _close_step(acc3, p3, xs3, c, s)
    out = out_ptr + (split * M).to(tl.int64) * N + rn
    ok = rn < N
    _store_row(out, acc0, ok)
    if M > 1:
        _store_row(out + N, acc1, ok)
    if M > 2:
        _store_row(out + 2 * N, acc2, ok)
    if M > 3:
        _store_row(out + 3 * N, acc3, ok)


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    conv: int = 0
    """How a value becomes a float: 0 shift and lop3; 1 prmt (4 bits, CUDA)."""
    prefetch: int = 0


def split_for(steps: int, programs: int, sms: int, waves: int = 4) -> int:
    """The largest divisor of the K steps at most `waves` programs per SM over the
    `programs` the row blocks give (at least 1)."""
    want = max(1, min(steps, round(waves * sms / max(programs, 1))))
    return max(d for d in range(1, want + 1) if steps % d == 0)


def _step_fits(block_k: int, group: int, k: int) -> bool:
    """Whether a K step of block_k values fits: a power of two dividing the group, or a
    multiple of a power-of-two group, dividing K."""
    return is_power_of_2(block_k) and k % block_k == 0 and (
        group % block_k == 0 or (block_k % group == 0 and is_power_of_2(group)))


@functools.lru_cache(maxsize=1024)  # asked on every call of the op
def default_config(m: int, n: int, k: int, group: int, block_k: int, sms: int = 132,
                   bits: int = 4, cuda: bool = True) -> GemvConfig:
    """block_k: a step inside the group (a power of two dividing it). The best of two H100
    searches on 8B's projections (benchmarks/results/h100-session46-zzz11[01]-*/): one
    row of x on 8 weight rows a program, one warp, 256 values of a row a step (where the
    group allows), K split for about 16 programs per SM (~10% under zzz110's best, 64
    rows x 128 on two warps, which stays the fallback); two rows on 128 weight rows, two
    warps, 128 a step, about 4 programs per SM (each row of x has its accumulators);
    prmt where it applies (4 bits, CUDA), within noise of the shift there."""
    block_k = min(block_k, 128)
    if m == 1 and _step_fits(256, group, k):
        block_n, block_k, warps, waves = 8, 256, 1, 16
    else:
        block_n, warps, waves = (64, 2, 8) if m == 1 else (128, 2, 4)
    return GemvConfig(block_n, block_k, split_for(k // block_k, cdiv(n, block_n), sms, waves),
                      num_warps=warps, conv=int(bits == 4 and cuda))


def int4_gemv(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
              zero: torch.Tensor | None, group_size: int, bits: int, block_k: int,
              config: GemvConfig | None = None, compile_only: bool = False) -> torch.Tensor:
    """x [M <= MAX_ROWS, K] @ w^T for `int4_linear.supports`' arguments, x's dtype out;
    block_k: the K step where no config is given (a power of two dividing the group).
    compile_only: compiled on `compile_pool`'s threads, nothing run."""
    from loom.kernels.int4_linear import split_partials, sum_splits
    (m, k), n = x.shape, packed.shape[0]
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"int4_gemv: takes 1..{MAX_ROWS} rows, got {m}")
    sms = sm_count(x.device) if x.is_cuda else 132
    cfg = config or default_config(m, n, k, group_size, block_k, sms, bits, x.is_cuda)
    bk = cfg.block_k
    if not (_step_fits(bk, group_size, k) and (k // bk) % cfg.split_k == 0):
        raise ValueError(f"int4_gemv: block_k {bk} must be a power of two dividing the "
                         f"group {group_size} or K {k} (a multiple of a power-of-two group), "
                         f"and split_k {cfg.split_k} the K steps")
    if cfg.conv == 1 and (bits != 4 or not x.is_cuda):
        raise ValueError("int4_gemv: conv 1 (prmt) takes 4-bit values on CUDA")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    split = cfg.split_k
    dest = split_partials(out, split)
    launch_or_compile(_int4_gemv_kernel, (cdiv(n, cfg.block_n), split), compile_only)(
        x, packed, scale, packed if zero is None else zero, dest, x.stride(0), EXPONENT_128,
        M=m, N=n, K=k, GROUP=group_size, HAS_ZERO=zero is not None, BITS=bits,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split, CONV=cfg.conv,
        PREFETCH=cfg.prefetch, num_warps=cfg.num_warps, num_stages=1)
    sum_splits(dest, out, compile_only)
    return out
