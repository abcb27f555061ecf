"""fp8 expert weights for the fused MoE kernels (W8A16): how one stacked expert weight
[E, N, K] (w13 or w2) is scaled, checked once per call and handed to the kernels as a
scale tensor [E, R, C] and three constexprs.

Activations stay in the model's dtype: each kernel loads an fp8 weight tile, converts it to
the activations' dtype in registers and multiplies as for an unquantized weight, so the
weights cost half the bytes to read and to hold. The scale is applied where it is
constant: a scale per output channel (llm-compressor's FP8_DYNAMIC, `-q fp8`) multiplies
the accumulator's columns once, after the K loop; a scale per GROUP_N x GROUP_K block
(Qwen3's FP8 releases, 128 x 128) multiplies each K step's partial product, so a K step
must lie within one block column (the grouped GEMM's BLOCK_K is capped at GROUP_K; the
GEMV splits a wider chunk into its groups).
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import torch

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
NONE, CHANNEL, BLOCK = 0, 1, 2
"""QUANT, the kernels' constexpr: unquantized, a scale per output channel, per block."""
DEFAULT_BLOCK = (128, 128)
"""The block of a 3-D scale given without `weight_block`: every fp8 release's."""


@dataclasses.dataclass(frozen=True)
class WeightQuant:
    """The scaling of one stacked expert weight [E, N, K]."""

    mode: int
    """NONE, CHANNEL or BLOCK."""
    scale: torch.Tensor | None = None
    """float32 [E, N, 1] (CHANNEL) or [E, ceil(N / GROUP_N), ceil(K / GROUP_K)] (BLOCK)."""
    group_n: int = 1
    group_k: int = 1

    def constexprs(self) -> dict[str, int]:
        return {"QUANT": self.mode, "GROUP_N": self.group_n, "GROUP_K": self.group_k}

    def pointer_args(self, weight: torch.Tensor) -> tuple:
        """(scale, stride over experts, over rows, over columns); an unquantized weight
        passes itself, never read (QUANT = 0 compiles the scale loads out)."""
        if self.scale is None:
            return weight, 0, 0, 0
        return (self.scale, *self.scale.stride())

    def block_k(self, block_k: int) -> int:
        """The K step a grouped GEMM can take: within one scale block column."""
        if self.mode != BLOCK or block_k <= self.group_k:
            return block_k
        _say_capped(block_k, self.group_k)
        return self.group_k


UNQUANTIZED = WeightQuant(NONE)


@dataclasses.dataclass(frozen=True)
class ExpertQuant:
    """Both stacked weights' scaling (each may be fp8 or not on its own)."""

    w13: WeightQuant = UNQUANTIZED
    w2: WeightQuant = UNQUANTIZED


def expert_quant(w13: torch.Tensor, w2: torch.Tensor, w13_scale: torch.Tensor | None,
                 w2_scale: torch.Tensor | None,
                 block: tuple[int, int] | list[int] | None) -> ExpertQuant:
    block = None if block is None else (int(block[0]), int(block[1]))
    if block is not None and min(block) < 1:
        raise ValueError(f"fused_moe: weight_block {block} must be two positive sizes")
    return ExpertQuant(weight_quant("w13", w13, w13_scale, block),
                       weight_quant("w2", w2, w2_scale, block))


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
def _say_capped(block_k: int, group_k: int) -> None:
    logger.info("fused_moe: the config's BLOCK_K %d spans several %d-column fp8 weight "
                "blocks; the grouped GEMM steps K by %d instead", block_k, group_k, group_k)


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
