"""Quantized expert weights for the fused MoE kernels, fp8 (W8A16), int4 (W4A16) or 8-bit
integers (W8A16): how one stacked expert weight [E, N, K] (w13 or w2) is scaled, checked
once per call and handed to the kernels as a scale tensor [E, R, C], a zero-point tensor
and four constexprs.

Activations stay in the model's dtype: each kernel loads an fp8 weight tile, converts it to
the activations' dtype in registers and multiplies as for an unquantized weight, so the
weights cost half the bytes to read and to hold. The scale is applied where it is
constant: a scale per output channel (llm-compressor's FP8_DYNAMIC, `-q fp8`) multiplies
the accumulator's columns once, after the K loop; a scale per GROUP_N x GROUP_K block
(Qwen3's FP8 releases, 128 x 128) multiplies each K step's partial product, so a K step
must lie within one block column (the grouped GEMM's BLOCK_K is capped at GROUP_K; the
GEMV splits a wider chunk into its groups).

int4 experts (AWQ / GPTQ / compressed-tensors pack-quantized releases, loom's dense layout,
loom/kernels/int4_linear.py) come packed: int32 [E, N, K / 8], column k's value (0..15) in
nibble k % 8 of word k // 8; a scale [E, N, K / G] in the activations' dtype and a uint8 zero
point of the same shape, or none (8 everywhere), per group of G columns:
w = (q - zero) * scale. Each kernel loads BLOCK_K / 8 words a row per K step, unpacks and
subtracts the zero points in registers, multiplies the activations by these small integers
(exact in bf16 / fp16) with float32 sums and scales that partial product by the group's
scales (float32, one per output column) before adding it to the accumulator; so a K step
lies within one group: BLOCK_K divides G (the grouped GEMM's BLOCK_K is capped at the
largest power of two dividing G; the GEMV splits a wider chunk into group-aligned parts).

8-bit integer experts (GPTQ-Int8, compressed-tensors' W8A16 releases; fused_moe's bits=8)
are packed the same way four to a word: int32 [E, N, K / 4], column k's value (0..255) in
byte k % 4 of word k // 4, zero points 0..255 or none (128). Their values less the zero
points (-255..255) are exact in bf16 and fp16 too, so the kernels treat them as int4 ones
(QUANT INT8: the kernels' BITS is 8 where QUANT says INT8, 4 where it says INT4).
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import torch

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
NONE, CHANNEL, BLOCK, INT4, INT8 = 0, 1, 2, 3, 4
"""QUANT, the kernels' constexpr: unquantized, an fp8 scale per output channel, per block;
int4 or 8-bit integers with a scale (and zero point) per group."""
INTEGER_MODES = {4: INT4, 8: INT8}
"""bits -> QUANT of packed integer experts."""
PACK = 8
"""int4 values per int32 word (8-bit: 4, `per_word`)."""
MIN_STEP = 16
"""A bf16 / fp16 tensor-core dot's smallest K step: an integer weight's group must hold a
power-of-two multiple of it."""
DEFAULT_BLOCK = (128, 128)
"""The block of a 3-D scale given without `weight_block`: every fp8 release's."""


@dataclasses.dataclass(frozen=True)
class WeightQuant:
    """The scaling of one stacked expert weight [E, N, K]."""

    mode: int
    """NONE, CHANNEL, BLOCK, INT4 or INT8."""
    scale: torch.Tensor | None = None
    """float32 [E, N, 1] (CHANNEL) or [E, ceil(N / GROUP_N), ceil(K / GROUP_K)] (BLOCK);
    INT4 / INT8: [E, N, K / G] in the activations' dtype, contiguous."""
    group_n: int = 1
    group_k: int = 1
    """BLOCK: the block's columns; INT4 / INT8: the group size G."""
    zero: torch.Tensor | None = None
    """INT4 / INT8: uint8 [E, N, K / G], contiguous like the scale (the kernels read it
    with the scale's strides), or None for 8 (128) everywhere."""

    @property
    def bits(self) -> int:
        """The packed integers' width (4 or 8); 0 for other weights."""
        return {INT4: 4, INT8: 8}.get(self.mode, 0)

    @property
    def per_word(self) -> int:
        """Values per int32 word of packed integer weights; 1 for other weights (a K step
        of BLOCK_K columns reads BLOCK_K / per_word elements a row)."""
        return 32 // self.bits if self.bits else 1

    def constexprs(self) -> dict[str, int]:
        return {"QUANT": self.mode, "GROUP_N": self.group_n, "GROUP_K": self.group_k,
                "HAS_ZERO": int(self.zero is not None)}

    def pointer_args(self, weight: torch.Tensor) -> tuple:
        """(scale, stride over experts, over rows, over columns, zero points); an
        unquantized weight passes itself and no zero points a stand-in, never read (QUANT 0
        and HAS_ZERO 0 compile those loads out)."""
        if self.scale is None:
            return weight, 0, 0, 0, weight
        return (self.scale, *self.scale.stride(),
                self.scale if self.zero is None else self.zero)

    @property
    def step(self) -> int:
        """The widest K step that lies within one scale column: the block's columns
        (BLOCK), the largest power of two dividing the group (INT4, INT8); 0 where
        unbounded."""
        if self.mode == BLOCK:
            return self.group_k
        if self.bits:
            return self.group_k & -self.group_k
        return 0

    def block_k(self, block_k: int) -> int:
        """The K step a grouped GEMM can take: within one scale block column or group."""
        if not self.step or block_k <= self.step:
            return block_k
        _say_capped(block_k, self.step,
                    f"does not divide the int{self.bits} weights' {self.group_k}-column groups"
                    if self.bits else
                    f"spans several {self.group_k}-column fp8 weight blocks")
        return self.step


UNQUANTIZED = WeightQuant(NONE)


@dataclasses.dataclass(frozen=True)
class ExpertQuant:
    """Both stacked weights' scaling (each may be fp8 or not on its own)."""

    w13: WeightQuant = UNQUANTIZED
    w2: WeightQuant = UNQUANTIZED

    @property
    def int4(self) -> bool:
        """Whether the experts are packed integers (int4, or 8-bit: see `bits`)."""
        return self.w13.bits > 0


def check_bits(bits: int) -> int:
    """Values per int32 word (8 or 4) of packed integer experts of `bits` bits; a
    ValueError naming bits for widths other than 4 and 8."""
    from loom.quantization.int4 import check_bits as words_of
    return words_of(bits, "fused_moe")


def is_int4(weight: torch.Tensor) -> bool:
    """Whether a stacked expert weight is packed integers (int32 words: eight int4 values
    a word, or four 8-bit ones)."""
    return weight.dtype == torch.int32


def in_features(weight: torch.Tensor, bits: int = 4) -> int:
    """K of a stacked expert weight [E, N, K] (packed integers: [E, N, K * bits / 32]
    words)."""
    return weight.shape[-1] * (check_bits(bits) if is_int4(weight) else 1)


def table_dtype(weight: torch.Tensor, bits: int = 4) -> torch.dtype | str:
    """The dtype key of the tuned table a stacked expert weight looks up first: 8-bit
    integer experts' own moe_config.INT8_TABLE_DTYPE (their int32 words would read as
    int4's), else moe_config.table_dtype's (int4's, fp8's, the weight's own)."""
    from loom.kernels.moe_config import INT8_TABLE_DTYPE
    from loom.kernels.moe_config import table_dtype as config_table_dtype
    check_bits(bits)
    if is_int4(weight) and bits == 8:
        return INT8_TABLE_DTYPE
    return config_table_dtype(weight)


def expert_quant(w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor | None,
                 w2_scale: torch.Tensor | None,
                 block: tuple[int, int] | list[int] | None,
                 w13_zero: torch.Tensor | None = None, w2_zero: torch.Tensor | None = None,
                 group_size: int | None = None,
                 dtype: torch.dtype | None = None, bits: int = 4) -> ExpertQuant:
    """Both weights' scaling, checked (dtype: the activations', which integer experts'
    scales share; bits: 4 or 8, the width of packed integer experts)."""
    check_bits(bits)
    if is_int4(w13) or is_int4(w2):
        if block is not None:
            raise ValueError(f"fused_moe: weight_block is for fp8 experts; int{bits} experts "
                             "take group_size")
        return ExpertQuant(
            int4_quant("w13", w13, w13_scale, w13_zero, group_size, dtype, bits),
            int4_quant("w2", w2, w2_scale, w2_zero, group_size, dtype, bits))
    for name, given in (("w13_zero", w13_zero), ("w2_zero", w2_zero),
                        ("group_size", group_size), ("bits", bits if bits != 4 else None)):
        if given is not None:
            raise ValueError(f"fused_moe: {name} is for int4 experts or 8-bit integer ones "
                             f"(int32 packed w13 and w2); these are {w13.dtype} and "
                             f"{w2.dtype}")
    block = None if block is None else (int(block[0]), int(block[1]))
    if block is not None and min(block) < 1:
        raise ValueError(f"fused_moe: weight_block {block} must be two positive sizes")
    return ExpertQuant(weight_quant("w13", w13, w13_scale, block),
                       weight_quant("w2", w2, w2_scale, block))


INT4_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def int4_quant(name: str, weight: torch.Tensor, scale: torch.Tensor | None,
               zero: torch.Tensor | None, group_size: int | None,
               dtype: torch.dtype | None, bits: int = 4) -> WeightQuant:
    """A packed integer weight's scaling: packed int32 [E, N, K * bits / 32] (bits 4 or 8),
    scale [E, N, K / G] in the activations' dtype, zero uint8 [E, N, K / G] or None, G =
    group_size dividing K and holding a power of two >= 16 (the K step); group_size None:
    each weight's own, as its scale's width gives it (a scale per channel is G = K: H for
    w13, I for w2). A ValueError for anything else."""
    per_word, kind = check_bits(bits), f"int{bits}"
    if not is_int4(weight):
        raise ValueError(f"fused_moe: {name} is {weight.dtype} beside an {kind} (int32 "
                         f"packed) expert weight; {kind} experts need both w13 and w2 {kind}")
    if weight.dim() != 3:
        raise ValueError(f"fused_moe: {name} must be packed int32 [E, N, K / {per_word}], got "
                         f"shape {tuple(weight.shape)}")
    if scale is None:
        raise ValueError(f"fused_moe: {name} is {kind} and needs {name}_scale")
    experts, rows, words = weight.shape
    cols = words * per_word
    group = int(group_size) if group_size is not None else _group_of(cols, scale)
    if group_size is None and not group:
        raise ValueError(f"fused_moe: {name}_scale's {scale.shape[-1]} columns do not split "
                         f"{name}'s {cols} input columns into whole groups")
    if group < 1 or cols % group:
        raise ValueError(f"fused_moe: group_size {group_size} must divide {name}'s "
                         f"{cols} input columns")
    if group & -group < MIN_STEP:
        raise ValueError(f"fused_moe: group_size {group} holds no power-of-two K step >= "
                         f"{MIN_STEP} (the kernels' tensor-core dot) for {name}")
    if dtype is not None and dtype not in INT4_DTYPES:
        raise ValueError(f"fused_moe: {kind} experts take bfloat16, float16 or float32 "
                         f"activations, got {dtype}")
    if dtype is not None and scale.dtype != dtype:
        raise ValueError(f"fused_moe: {name}_scale must be in the activations' dtype "
                         f"{dtype}, got {scale.dtype}")
    want = (experts, rows, cols // group)
    if tuple(scale.shape) != want:
        raise ValueError(f"fused_moe: {name}_scale of shape {tuple(scale.shape)} is not "
                         f"{want} (a scale per {group}-column group of the {rows} x {cols} "
                         f"{name})")
    if zero is not None and (zero.dtype != torch.uint8 or tuple(zero.shape) != want):
        raise ValueError(f"fused_moe: {name}_zero must be uint8 {want}, got "
                         f"{zero.dtype} {tuple(zero.shape)}")
    if (zero is not None and zero.device != weight.device) or scale.device != weight.device:
        raise ValueError(f"fused_moe: {name}'s scale and zero points must be on "
                         f"{weight.device}")
    return WeightQuant(INTEGER_MODES[bits], scale.contiguous(), 1, group,
                       None if zero is None else zero.contiguous())


def _group_of(cols: int, scale: torch.Tensor) -> int:
    """The group size a packed integer weight's scale implies: its K over the scale's width
    (0, which every check refuses, where that is no whole number)."""
    width = scale.shape[-1]
    return cols // width if width and cols % width == 0 else 0


def weight_quant(name: str, weight: torch.Tensor, scale: torch.Tensor | None,
                 block: tuple[int, int] | None) -> WeightQuant:
    """The scaling `scale` gives `weight` (named `name` in errors): none, per channel
    ([E, N] or [E, N, 1]) or per block ([E, ceil(N / rows), ceil(K / cols)] for
    block = (rows, cols), 128 x 128 if None). A ValueError for anything else."""
    if scale is None:
        if weight.dtype.is_floating_point and weight.element_size() == 1:
            raise ValueError(f"fused_moe: {name} is {weight.dtype} and needs {name}_scale")
        return UNQUANTIZED
    if weight.dtype != FP8:
        raise ValueError(f"fused_moe: {name}_scale is given for a {weight.dtype} {name}; the "
                         "kernels read scaled weights as float8_e4m3fn")
    if scale.dtype != torch.float32:
        raise ValueError(f"fused_moe: {name}_scale must be float32, got {scale.dtype}")
    experts, rows, cols = weight.shape
    if tuple(scale.shape) in ((experts, rows), (experts, rows, 1)):
        return WeightQuant(CHANNEL, scale.reshape(experts, rows, 1))
    group_n, group_k = block or DEFAULT_BLOCK
    want = (experts, -(-rows // group_n), -(-cols // group_k))
    if tuple(scale.shape) != want:
        raise ValueError(f"fused_moe: {name}_scale of shape {tuple(scale.shape)} fits neither "
                         f"a scale per output channel ({experts}, {rows}[, 1]) nor "
                         f"{group_n}x{group_k} blocks {want} of the {tuple(weight.shape)} "
                         f"{name}")
    if group_k < 16 or group_k & (group_k - 1):
        raise ValueError(f"fused_moe: {name}_scale's blocks are {group_k} columns wide; the "
                         "kernels take block columns that are a power of two >= 16")
    return WeightQuant(BLOCK, scale, group_n, group_k)


@functools.cache
def _say_capped(block_k: int, step: int, why: str) -> None:
    logger.info("fused_moe: the config's BLOCK_K %d %s; the grouped GEMM steps K by %d "
                "instead", block_k, why, step)


def dequantize(values: torch.Tensor, scale: torch.Tensor | None,
               block: tuple[int, int] | None) -> torch.Tensor:
    """One expert's weight [N, K] in float32: its fp8 values times their scales (per row,
    a [N] or [N, 1] scale; per block, a 2-D one of `block`, 128 x 128 if None); an
    unquantized weight as it is."""
    if scale is None:
        return values.float()
    rows, cols = values.shape
    if scale.numel() == rows and (scale.dim() == 1 or scale.shape[-1] == 1):
        return values.float() * scale.reshape(rows, 1)
    from loom.quantization.fp8_block import dequantize as block_dequantize
    return block_dequantize(values, scale, *(block or DEFAULT_BLOCK))


def dequantize_expert(weight: torch.Tensor, expert: int, scale: torch.Tensor | None,
                      block: tuple[int, int] | None, zero: torch.Tensor | None = None,
                      group_size: int | None = None, bits: int = 4) -> torch.Tensor:
    """Expert `expert`'s weight [N, K] in float32: packed integer ones (bits 4 or 8)
    through loom.quantization.int4's dequantize, the others through `dequantize`."""
    per_word = check_bits(bits)
    if is_int4(weight):
        from loom.quantization.int4 import dequantize as int_dequantize
        group = (int(group_size) if group_size is not None
                 else _group_of(weight.shape[-1] * per_word, scale))
        return int_dequantize(weight[expert], scale[expert],
                              None if zero is None else zero[expert], group, bits)
    return dequantize(weight[expert], None if scale is None else scale[expert], block)
