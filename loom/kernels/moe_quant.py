"""Quantized expert weights for the fused MoE kernels, fp8 (W8A16) or int4 (W4A16): how
one stacked expert weight [E, N, K] (w13 or w2) is scaled, checked once per call and handed
to the kernels as a scale tensor [E, R, C], a zero-point tensor and four constexprs.

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
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import torch

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
NONE, CHANNEL, BLOCK, INT4 = 0, 1, 2, 3
"""QUANT, the kernels' constexpr: unquantized, an fp8 scale per output channel, per block;
int4 with a scale (and zero point) per group."""
PACK = 8
"""int4 values per int32 word."""
MIN_STEP = 16
"""A bf16 / fp16 tensor-core dot's smallest K step: an int4 group must hold a power-of-two
multiple of it."""
DEFAULT_BLOCK = (128, 128)
"""The block of a 3-D scale given without `weight_block`: every fp8 release's."""


@dataclasses.dataclass(frozen=True)
class WeightQuant:
    """The scaling of one stacked expert weight [E, N, K]."""

    mode: int
    """NONE, CHANNEL, BLOCK or INT4."""
    scale: torch.Tensor | None = None
    """float32 [E, N, 1] (CHANNEL) or [E, ceil(N / GROUP_N), ceil(K / GROUP_K)] (BLOCK);
    INT4: [E, N, K / G] in the activations' dtype, contiguous."""
    group_n: int = 1
    group_k: int = 1
    """BLOCK: the block's columns; INT4: the group size G."""
    zero: torch.Tensor | None = None
    """INT4: uint8 [E, N, K / G], contiguous like the scale (the kernels read it with the
    scale's strides), or None for 8 everywhere."""

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
        (BLOCK), the largest power of two dividing the group (INT4); 0 where unbounded."""
        if self.mode == BLOCK:
            return self.group_k
        if self.mode == INT4:
            return self.group_k & -self.group_k
        return 0

    def block_k(self, block_k: int) -> int:
        """The K step a grouped GEMM can take: within one scale block column or group."""
        if not self.step or block_k <= self.step:
            return block_k
        _say_capped(block_k, self.step,
                    f"does not divide the int4 weights' {self.group_k}-column groups"
                    if self.mode == INT4 else
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
        return self.w13.mode == INT4


def is_int4(weight: torch.Tensor) -> bool:
    """Whether a stacked expert weight is int4, packed eight values a word."""
    return weight.dtype == torch.int32


def in_features(weight: torch.Tensor) -> int:
    """K of a stacked expert weight [E, N, K] (int4: [E, N, K / 8] words)."""
    return weight.shape[-1] * (PACK if is_int4(weight) else 1)


def expert_quant(w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor | None,
                 w2_scale: torch.Tensor | None,
                 block: tuple[int, int] | list[int] | None,
                 w13_zero: torch.Tensor | None = None, w2_zero: torch.Tensor | None = None,
                 group_size: int | None = None,
                 dtype: torch.dtype | None = None) -> ExpertQuant:
    """Both weights' scaling, checked (dtype: the activations', which int4 scales share)."""
    if is_int4(w13) or is_int4(w2):
        if block is not None:
            raise ValueError("fused_moe: weight_block is for fp8 experts; int4 experts take "
                             "group_size")
        return ExpertQuant(int4_quant("w13", w13, w13_scale, w13_zero, group_size, dtype),
                           int4_quant("w2", w2, w2_scale, w2_zero, group_size, dtype))
    for name, given in (("w13_zero", w13_zero), ("w2_zero", w2_zero),
                        ("group_size", group_size)):
        if given is not None:
            raise ValueError(f"fused_moe: {name} is for int4 experts (int32 packed w13 and "
                             f"w2); these are {w13.dtype} and {w2.dtype}")
    block = None if block is None else (int(block[0]), int(block[1]))
    if block is not None and min(block) < 1:
        raise ValueError(f"fused_moe: weight_block {block} must be two positive sizes")
    return ExpertQuant(weight_quant("w13", w13, w13_scale, block),
                       weight_quant("w2", w2, w2_scale, block))


INT4_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def int4_quant(name: str, weight: torch.Tensor, scale: torch.Tensor | None,
               zero: torch.Tensor | None, group_size: int | None,
               dtype: torch.dtype | None) -> WeightQuant:
    """An int4 weight's scaling: packed int32 [E, N, K / 8], scale [E, N, K / G] in the
    activations' dtype, zero uint8 [E, N, K / G] or None, G = group_size dividing K and
    holding a power of two >= 16 (the K step); group_size None: each weight's own, as its
    scale's width gives it (a scale per channel is G = K: H for w13, I for w2). A
    ValueError for anything else."""
    if not is_int4(weight):
        raise ValueError(f"fused_moe: {name} is {weight.dtype} beside an int4 (int32 packed) "
                         "expert weight; int4 experts need both w13 and w2 int4")
    if weight.dim() != 3:
        raise ValueError(f"fused_moe: {name} must be packed int32 [E, N, K / 8], got shape "
                         f"{tuple(weight.shape)}")
    if scale is None:
        raise ValueError(f"fused_moe: {name} is int4 and needs {name}_scale")
    experts, rows, words = weight.shape
    cols = words * PACK
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
        raise ValueError(f"fused_moe: int4 experts take bfloat16, float16 or float32 "
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
    return WeightQuant(INT4, scale.contiguous(), 1, group,
                       None if zero is None else zero.contiguous())


def _group_of(cols: int, scale: torch.Tensor) -> int:
    """The group size an int4 weight's scale implies: its K over the scale's width (0, which
    every check refuses, where that is no whole number)."""
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
                      group_size: int | None = None) -> torch.Tensor:
    """Expert `expert`'s weight [N, K] in float32: int4 ones through
    loom.quantization.int4.dequantize, the others through `dequantize`."""
    if is_int4(weight):
        from loom.quantization.int4 import dequantize as int4_dequantize
        group = (int(group_size) if group_size is not None
                 else _group_of(weight.shape[-1] * PACK, scale))
        return int4_dequantize(weight[expert], scale[expert],
                               None if zero is None else zero[expert], group)
    return dequantize(weight[expert], None if scale is None else scale[expert], block)
