"""Integer-weight linear layers with 16-bit activations on CUDA, behind one opaque op,
`loom::int4_linear`: 4-bit weights (W4A16: AWQ, GPTQ and compressed-tensors' pack-quantized
int4 checkpoints) and, with bits=8, 8-bit ones (W8A16: GPTQ-Int8, compressed-tensors'
W8A16), packed the same way.

The weight comes as the loader lays it out: `packed` int32 [N, K * bits / 32], value
k % P of word k // P holding w_q[n, k] (0 .. 2^bits - 1) in bits (k % P) * bits .. + bits - 1,
P = 32 / bits values a word (8 nibbles, or 4 bytes); `scale` [N, K / G] in the activations'
dtype; `zero` uint8 [N, K / G], or None for a zero point of 2^(bits - 1) everywhere (8, or
128). The weight is w[n, k] = (w_q[n, k] - zero[n, k // G]) * scale[n, k // G], and
out = x @ w^T.

The tensor-core tile: a program owns a BLOCK_M x BLOCK_N output tile and walks its share
of K in BLOCK_K steps, BLOCK_K dividing G so that a step lies in one group. Each step loads
BLOCK_K / P words a weight row (the only weight bytes read), shifts and masks the values
(so an int32 word's sign does not matter), subtracts the zero points (`_less_zeros`: by
default bf16's own bits, 0x4300 | q being 128 + q, less 128 + zero; no int-to-float
conversion), and multiplies the rows of x by these small integers on the tensor cores with
float32 sums: -15..15 for 4 bits, -255..255 for 8, exact in bfloat16 (8 significant bits:
every integer up to 256 in magnitude) and float16 (up to 2048). With `slabs` a step is P
dots, one per value position of the words (the K sum in another order): the values stay
in the words' layout, and x is read as one tile split in registers. That partial tile is
then multiplied by the group's scales, one float32 per column, and added to the float32
accumulator. Scaling before the dot would round every weight to the activations' dtype
first; here the only roundings are the dot's float32 sums and the output's one cast.

Three regimes, chosen by the op from the row count:

* one or two rows (GEMV_ROWS): `int4_gemv`, on the CUDA cores;
* 3..16 rows (DECODE_ROWS): the tile, the rows padded to one 16-row tensor-core tile. N /
  BLOCK_N programs would leave most of the 132 SMs idle for a small N, so K is split into
  SPLIT_K slices (a divisor of the K steps, so no step is masked). Each slice stores its
  float32 partial tile into [SPLIT_K, M, N] and a second small kernel sums the slices in
  order and casts (deterministic, where float32 atomics would round by arrival order);
* more rows: the weight dequantized whole (`_dequant_kernel`: each value (w_q - zero) *
  scale in float32, rounded once) and the dense GEMM, as vLLM's AWQ layer does from 256
  rows. The tiled GEMM (`int4_matmul` with a prompt config) lost to it at 64 and 256
  rows on an H100 (benchmarks/results/h100-session45-zzz107-*/).

`default_config`'s decode tiles are an H100 search's best (`benchmarks/gpu/int4_tune.py`).
They still run at 0.15-0.33 of the copy rate at one row, 1.2-1.5x faster than bf16 where a
quarter of the bytes should give ~3.5x: the unpacking's instructions and latency, not the
bytes, bound them. K and N are constexprs (one compile per layer shape; the K loop's
bound is then a constexpr, which Triton 3.6's interpreter needs); M is not. `dequantize`
is the plain-torch float32 weight: the reference, and the path of calls the kernel does
not take (a CPU tensor outside the interpreter, or shapes `supports` refuses):
loom.quantization.int4's `dequantize`.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from loom.kernels import int4_gemv
from loom.kernels.compile_pool import launch_or_compile
from loom.kernels.fp8_block_gemm import swizzled_tile
from loom.kernels.host import cdiv, sm_count
from loom.kernels.int4_gemv import split_for
from loom.kernels.interpreter import interpreted
from loom.kernels.launch import fast_launch
from loom.library import loom_op
from loom.quantization.int4 import check_bits, dequantize

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MIN_BLOCK_K = 16
"""A bf16/fp16 tensor-core dot's smallest K step: a group must hold a power-of-two
multiple of it."""
DECODE_ROWS = 16
"""Row counts up to this take the split-K decode regime, padded to one 16-row tile."""
GEMV_ROWS = 2
"""Row counts up to this take `int4_gemv`: on an H100 it took 26-48% less time than the
tile at one row and 9-26% at two, and lost at three and four on gate_up and down
(benchmarks/results/h100-session46-zzz11[012]-*/)."""


@triton.jit
def _less_zeros(q, z, elem: tl.constexpr, BITS: tl.constexpr, CONVERT: tl.constexpr):
    """q - z[:, None] in elem, exactly: q [R, C] int32 values 0 .. 2^BITS - 1, z [R] int32
    zero points. How the integers become elem:
    0: int32 -> float32 -> elem (I2F and F2F, the conversion pipe);
    1: float32 from its bits: 0x4B400000 + (q - z) is 2^23 + 2^22 + q - z, less that
       constant (an integer add and a float add), then elem;
    2: elem from its own bits where that holds every q: 0x4300 | q is bfloat16 128 + q (4
       bits only: 7 mantissa bits), 0x6400 | q float16 1024 + q; less 128 + z (or
       1024 + z), exact in elem. Otherwise 1."""
    if CONVERT == 2 and ((elem == tl.bfloat16 and BITS == 4) or elem == tl.float16):
        BASE: tl.constexpr = 0x4300 if elem == tl.bfloat16 else 0x6400
        OFFSET: tl.constexpr = 128 if elem == tl.bfloat16 else 1024
        v = (q | BASE).to(tl.int16).to(elem, bitcast=True)
        return v - (z + OFFSET).to(tl.float32).to(elem)[:, None]
    elif CONVERT >= 1:
        bits = q + (0x4B400000 - z)[:, None]
        return (bits.to(tl.float32, bitcast=True) - 12582912.0).to(elem)
    else:
        # Through float32 because Triton 3.6's interpreter converts int32 to bfloat16 as
        # raw bits; sm_90's compile folds the two casts into one cvt.rn.bf16.s32.
        return (q - z[:, None]).to(tl.float32).to(elem)


@triton.jit
def _x_slabs(x, BLOCK_M: tl.constexpr, WORDS: tl.constexpr, PER_WORD: tl.constexpr):
    """x [BLOCK_M, WORDS, PER_WORD] (PER_WORD 8 or 4) -> its PER_WORD slabs [BLOCK_M,
    WORDS], slab v holding x[:, :, v]: splits in registers (the last dims are each
    thread's own), so x is read as one contiguous tile."""
    if PER_WORD == 8:
        a, b = tl.split(tl.reshape(x, (BLOCK_M, WORDS, 2, 2, 2)))  # v's bit 0
        a0, a1 = tl.split(a)  # bit 1
        b0, b1 = tl.split(b)
        a00, a01 = tl.split(a0)  # bit 2
        a10, a11 = tl.split(a1)
        b00, b01 = tl.split(b0)
        b10, b11 = tl.split(b1)
        return a00, b00, a10, b10, a01, b01, a11, b11
    else:
        a, b = tl.split(tl.reshape(x, (BLOCK_M, WORDS, 2, 2)))
        a0, a1 = tl.split(a)
        b0, b1 = tl.split(b)
        return a0, b0, a1, b1


@triton.jit
def _int4_kernel(x_ptr, w_ptr, s_ptr, z_ptr, out_ptr, M, stride_x, N: tl.constexpr,
                 K: tl.constexpr, GROUP: tl.constexpr, HAS_ZERO: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, SWIZZLE_M: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, BITS: tl.constexpr, CONVERT: tl.constexpr,
                 SLABS: tl.constexpr):
    # SPLIT_K 1: out is [M, N] in x's dtype; else the float32 partials [SPLIT_K, M, N].
    # BITS 4 or 8: PER_WORD values a word, each masked by MASK; no zero points: MID.
    # SLABS: each step is PER_WORD dots, one per value position v of the words: value v
    # of word j is column PER_WORD * j + v, so the words' v-th values against those
    # columns of x are a dot of BLOCK_K / PER_WORD (>= 16), the K sum in another order.
    # The values stay in the words' own layout (no reshape), which lets the compiler move
    # the words, not 16-bit values, into the dot's operand layout; x is read as one tile
    # and split in registers (`_x_slabs`). Else the words are unpacked to
    # [BLOCK_N, BLOCK_K], one dot a step.
    PER_WORD: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    MID: tl.constexpr = 1 << (BITS - 1)
    GROUPS: tl.constexpr = K // GROUP
    K_ITERS: tl.constexpr = K // BLOCK_K // SPLIT_K
    pid_m, pid_n = swizzled_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, SWIZZLE_M)
    split = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, n_ok = rm < M, rn < N
    k0 = split * (K_ITERS * BLOCK_K)
    rk = tl.arange(0, BLOCK_K)
    words = tl.arange(0, BLOCK_K // PER_WORD)
    shifts = tl.arange(0, PER_WORD) * BITS
    x_ptrs = x_ptr + rm.to(tl.int64)[:, None] * stride_x + (k0 + rk)[None, :]
    xs_ptrs = x_ptr + rm.to(tl.int64)[:, None, None] * stride_x \
        + (k0 + words * PER_WORD)[None, :, None] + tl.arange(0, PER_WORD)[None, None, :]
    w_ptrs = w_ptr + rn.to(tl.int64)[:, None] * (K // PER_WORD) \
        + (k0 // PER_WORD + words)[None, :]
    gs_ptrs = rn.to(tl.int64) * GROUPS
    elem = x_ptr.dtype.element_ty
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(K_ITERS):
        group = (k0 + i * BLOCK_K) // GROUP
        packed = tl.load(w_ptrs, mask=n_ok[:, None], other=0)
        if HAS_ZERO:
            z = tl.load(z_ptr + gs_ptrs + group, mask=n_ok, other=0).to(tl.int32)
        else:
            z = tl.full((BLOCK_N,), MID, tl.int32)
        # the values less the zero points: -15..15 (4 bits) or -255..255 (8 bits), exact
        # in elem
        if SLABS:
            xs = _x_slabs(tl.load(xs_ptrs, mask=m_ok[:, None, None], other=0.0), BLOCK_M,
                          BLOCK_K // PER_WORD, PER_WORD)
            part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for v in tl.static_range(PER_WORD):
                w = _less_zeros((packed >> (v * BITS)) & MASK, z, elem, BITS, CONVERT)
                part = tl.dot(xs[v], tl.trans(w), part, input_precision=DOT_PRECISION)
        else:
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            # [BLOCK_N, BLOCK_K / PER_WORD, PER_WORD] values, row-major: column k of the
            # tile is value k % PER_WORD of word k // PER_WORD
            q = (packed[:, :, None] >> shifts[None, None, :]) & MASK
            w = _less_zeros(tl.reshape(q, (BLOCK_N, BLOCK_K)), z, elem, BITS, CONVERT)
            part = tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
        s = tl.load(s_ptr + gs_ptrs + group, mask=n_ok, other=0.0).to(tl.float32)
        acc += part * s[None, :]
        x_ptrs += BLOCK_K
        xs_ptrs += BLOCK_K
        w_ptrs += BLOCK_K // PER_WORD
    out_ptrs = out_ptr + (split * M).to(tl.int64) * N + rm.to(tl.int64)[:, None] * N \
        + rn[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, z_ptr, out_ptr, N: tl.constexpr, K: tl.constexpr,
                    GROUP: tl.constexpr, HAS_ZERO: tl.constexpr, BITS: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[n, k] = (w_q[n, k] - zero) * scale in out's dtype, one BLOCK_N x BLOCK_K tile a
    program (BLOCK_K dividing the group: one scale a row per tile)."""
    PER_WORD: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    MID: tl.constexpr = 1 << (BITS - 1)
    GROUPS: tl.constexpr = K // GROUP
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = rn < N
    k0 = tl.program_id(1) * BLOCK_K
    words = tl.arange(0, BLOCK_K // PER_WORD)
    packed = tl.load(w_ptr + rn.to(tl.int64)[:, None] * (K // PER_WORD)
                     + (k0 // PER_WORD + words)[None, :], mask=n_ok[:, None], other=0)
    shifts = tl.arange(0, PER_WORD) * BITS
    q = tl.reshape((packed[:, :, None] >> shifts[None, None, :]) & MASK, (BLOCK_N, BLOCK_K))
    gs = rn.to(tl.int64) * GROUPS + k0 // GROUP
    if HAS_ZERO:
        z = tl.load(z_ptr + gs, mask=n_ok, other=0).to(tl.int32)
    else:
        z = tl.full((BLOCK_N,), MID, tl.int32)
    s = tl.load(s_ptr + gs, mask=n_ok, other=0.0).to(tl.float32)
    w = (q - z[:, None]).to(tl.float32) * s[:, None]
    tl.store(out_ptr + rn.to(tl.int64)[:, None] * K + (k0 + tl.arange(0, BLOCK_K))[None, :],
             w.to(out_ptr.dtype.element_ty), mask=n_ok[:, None])


@triton.jit
def _sum_splits_kernel(part_ptr, out_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    # out.flat[i] = sum over the slices of part[s].flat[i], in slice order, cast once
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + s * MN + offs, mask=ok, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=ok)


@dataclasses.dataclass(frozen=True)
class Int4Config:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    swizzle_m: int = 8
    convert: int = 0
    slabs: bool = False


def block_k_for(group_size: int) -> int:
    """The K step: the largest power of two dividing the group, at most 128 (0 where it is
    below MIN_BLOCK_K: the kernel cannot take the group)."""
    block_k = min(128, group_size & -group_size) if group_size > 0 else 0
    return block_k if block_k >= MIN_BLOCK_K else 0


@functools.lru_cache(maxsize=1024)  # asked on every call of the op
def default_config(m: int, n: int, k: int, group_size: int, sms: int = 132,
                   bits: int = 4) -> Int4Config:
    """Decode rows: the best of an H100 search (benchmarks/results/h100-session45-zzz107-*/,
    8B's projections): 16 x 64 tiles by slabs (where a step's words give a dot of 16) with
    bf16's own bits, K split for about four programs per SM. Prompt rows (the op
    dequantizes instead; `int4_matmul` only): 64 x 64 tiles up to 64 rows, 128 x 128
    beyond."""
    block_k = block_k_for(group_size)
    if m <= DECODE_ROWS:
        split = split_for(k // block_k, cdiv(n, 64), sms)
        return Int4Config(16, 64, block_k, split, num_warps=4, num_stages=3, convert=2,
                          slabs=block_k * bits // 32 >= MIN_BLOCK_K)
    if m <= 64:
        return Int4Config(64, 64, block_k, num_warps=4, num_stages=4)
    return Int4Config(128, 128, block_k, num_warps=8, num_stages=3)


def kernel_applies(k: int, group_size: int, bits: int = 4) -> bool:
    """Whether a layer of K input features in groups of group_size suits the kernel (the
    shape half of `supports`): K a multiple of 32 / bits and of G, G of a power of two
    >= 16. bits other than 4 or 8: a ValueError."""
    per_word = check_bits(bits, "int4_linear")
    return k % per_word == 0 and group_size > 0 and k % group_size == 0 and bool(
        block_k_for(group_size))


def supports(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
             zero: torch.Tensor | None, group_size: int, bits: int = 4) -> bool:
    """Whether the kernel takes these: x [M, K] in bf16/fp16/fp32 with unit column stride,
    packed int32 [N, K * bits / 32], scale [N, K / G] in x's dtype, zero uint8 [N, K / G]
    or None, K a multiple of 32 / bits and of G, and G a multiple of a power of two >= 16.
    bits other than 4 or 8: a ValueError."""
    per_word = check_bits(bits, "int4_linear")
    if x.dim() != 2 or packed.dim() != 2 or x.dtype not in DTYPES:
        return False
    (n, words), k = packed.shape, x.shape[1]
    if words * per_word != k or not kernel_applies(k, group_size, bits):
        return False
    groups = (n, k // group_size)
    return (packed.dtype == torch.int32 and packed.is_contiguous() and x.stride(-1) == 1
            and scale.dtype == x.dtype and tuple(scale.shape) == groups
            and scale.is_contiguous()
            and (zero is None or (zero.dtype == torch.uint8 and tuple(zero.shape) == groups
                                  and zero.is_contiguous())))


def int4_matmul(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                zero: torch.Tensor | None, group_size: int, bits: int = 4,
                config: Int4Config | None = None, compile_only: bool = False
                ) -> torch.Tensor:
    """x @ w^T by the kernel for `supports`' arguments (bits: 4 or 8), x's dtype [M, N]
    out; config: `default_config`'s where not given (its block_k must divide the group).
    compile_only: the kernels compiled, nothing run (inside `compile_pool`, on its
    threads), an unwritten out returned."""
    check_bits(bits, "int4_matmul")
    (m, k), n = x.shape, packed.shape[0]
    sms = sm_count(x.device) if x.is_cuda else 132
    cfg = config or default_config(m, n, k, group_size, sms, bits)
    if group_size % cfg.block_k or (k // cfg.block_k) % cfg.split_k:
        raise ValueError(f"int4_matmul: block_k {cfg.block_k} must divide the group "
                         f"{group_size} and split_k {cfg.split_k} the K steps")
    if cfg.slabs and cfg.block_k * bits // 32 < MIN_BLOCK_K:
        raise ValueError(f"int4_matmul: slabs need block_k * bits / 32 >= {MIN_BLOCK_K} "
                         f"(a dot's K), got block_k {cfg.block_k}")
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    split = cfg.split_k
    dest = split_partials(out, split)
    grid = (cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n), split)
    launch_or_compile(_int4_kernel, grid, compile_only)(
        x, packed, scale, packed if zero is None else zero, dest, m, x.stride(0), N=n, K=k,
        GROUP=group_size, HAS_ZERO=zero is not None, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split, SWIZZLE_M=cfg.swizzle_m,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", BITS=bits,
        CONVERT=cfg.convert, SLABS=cfg.slabs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    sum_splits(dest, out, compile_only)
    return out


def split_partials(out: torch.Tensor, split: int) -> torch.Tensor:
    """Where a split-K launch writes: out itself (one slice), else float32 partials
    [split, M, N] for `sum_splits`."""
    return out if split == 1 else torch.empty(split, *out.shape, dtype=torch.float32,
                                               device=out.device)


def sum_splits(dest: torch.Tensor, out: torch.Tensor, compile_only: bool = False) -> None:
    """`split_partials`' partials summed into out in slice order (`_sum_splits_kernel`:
    deterministic); nothing where the launch wrote out itself."""
    if dest is out:
        return
    block = 1024
    launch_or_compile(_sum_splits_kernel, (cdiv(out.numel(), block),), compile_only)(
        dest, out, out.numel(), SPLIT_K=dest.shape[0], BLOCK=block, num_warps=4)


def dequantize_packed(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
                      group_size: int, bits: int = 4) -> torch.Tensor:
    """The weight [N, K] in the scales' dtype, by `_dequant_kernel`: each value
    (w_q - zero) * scale computed in float32 and rounded once, as `dequantize` computes it
    (equal to its result cast). For `supports`' shapes."""
    n, k = packed.shape[0], packed.shape[1] * check_bits(bits, "dequantize_packed")
    out = torch.empty(n, k, dtype=scale.dtype, device=packed.device)
    block_k, block_n = block_k_for(group_size), 64
    fast_launch(_dequant_kernel, (cdiv(n, block_n), k // block_k))(
        packed, scale, packed if zero is None else zero, out, N=n, K=k, GROUP=group_size,
        HAS_ZERO=zero is not None, BITS=bits, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=4)
    return out


@loom_op("int4_linear", "(Tensor x, Tensor packed, Tensor scale, Tensor? zero, "
                        "int group_size, int bits=4) -> Tensor")
def int4_linear(x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor,
                zero: torch.Tensor | None, group_size: int, bits: int = 4) -> torch.Tensor:
    """x (M, K) @ the int4 (bits=8: 8-bit) weight (N, K)^T, x's dtype out (the module's
    docstring has the layout). One opaque op, so that compiled graphs hold it as a node
    and the regime is chosen from each call's real row count. Shapes `supports` refuses,
    and CPU tensors outside Triton's interpreter, take `dequantize` and a float32
    matmul. bits other than 4 or 8: a ValueError."""
    check_bits(bits, "int4_linear")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if supports(x, packed, scale, zero, group_size, bits) and (
            x.is_cuda or interpreted(_int4_kernel)):
        if x.shape[0] > DECODE_ROWS:  # prompt rows: the weight whole, then a dense GEMM
            return F.linear(x, dequantize_packed(packed, scale, zero, group_size, bits))
        if 0 < x.shape[0] <= GEMV_ROWS:  # one or two rows: on the CUDA cores
            return int4_gemv.int4_gemv(x, packed, scale, zero, group_size, bits,
                                       block_k_for(group_size))
        return int4_matmul(x, packed, scale, zero, group_size, bits)
    w = dequantize(packed, scale, zero, group_size, bits)
    return (x.float() @ w.t()).to(x.dtype)


@int4_linear.register_fake
def _(x, packed, scale, zero, group_size, bits=4):
    check_bits(bits, "int4_linear")
    return x.new_empty(x.shape[0], packed.shape[0])
