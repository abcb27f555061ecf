"""fp8 checkpoint tensors for parameters that are not fp8 linear layers: MoE experts
(Qwen3's MoE FP8 releases quantize every expert block-wise, llm-compressor's FP8_DYNAMIC
recipes every expert per channel) and anything loom keeps in the model's dtype (a router
a checkpoint quantized).

A weight and its scale arrive as two tensors in either order, so each waits for the other;
the pair then goes whole to a parameter that takes fp8 (the experts,
`loom.quantization.fp8_moe`), or is dequantized for one that does not: the fp8 values
times their scales, exactly (an fp8 value times a float32 scale, rounded once to the
model's dtype). A static `input_scale` of such a weight has nothing to scale (its
activations stay unquantized) and is dropped. An fp8 weight with no scale, or a scale with
no weight, is an error naming it at the end of the load: never a silent cast.
"""

from __future__ import annotations

import dataclasses
import logging

import torch

logger = logging.getLogger(__name__)

_WEIGHT_SCALES = (".weight_scale_inv", ".weight_scale")
_INPUT_SCALE = ".input_scale"


@dataclasses.dataclass(frozen=True)
class Fp8Tensor:
    """A checkpoint's fp8 weight with its scale, once both have arrived."""

    name: str
    """The weight's checkpoint name."""
    values: torch.Tensor
    scale: torch.Tensor


class Fp8Dequantizer:
    """Pairs fp8 weights with their scales. block: the checkpoint's (rows, cols) scale block
    for 2-D scales (quantization_config.weight_block_size); None: taken from the shapes."""

    def __init__(self, block: tuple[int, int] | None) -> None:
        self.block = block
        self.weights: dict[str, torch.Tensor] = {}
        self.scales: dict[str, torch.Tensor] = {}
        self.done = 0

    @staticmethod
    def is_scale(name: str) -> bool:
        return name.endswith(_WEIGHT_SCALES + (_INPUT_SCALE,))

    def weight(self, name: str, tensor: torch.Tensor) -> Fp8Tensor | None:
        """An fp8 weight: paired with its scale if that has arrived, else None (it waits)."""
        scale = self.scales.pop(name, None)
        if scale is None:
            self.weights[name] = tensor
            return None
        return Fp8Tensor(name, tensor, scale)

    def add_scale(self, name: str, tensor: torch.Tensor) -> Fp8Tensor | None:
        """A scale with no parameter of its own: paired with its weight if that has arrived,
        else None (it waits). Input scales are dropped."""
        if name.endswith(_INPUT_SCALE):
            return None
        weight = name[:name.rindex(".weight_scale")] + ".weight"
        pending = self.weights.pop(weight, None)
        if pending is None:
            self.scales[weight] = tensor
            return None
        return Fp8Tensor(weight, pending, tensor)

    def check_done(self) -> None:
        if self.done:
            logger.info("fp8 checkpoint: %d weights of layers loom keeps in the model's dtype "
                        "(MoE routers) dequantized with their scales as they loaded",
                        self.done)
        if self.weights or self.scales:
            names = sorted(self.weights) + sorted(n + "_scale" for n in self.scales)
            raise ValueError(
                f"checkpoint tensor(s) {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                ": an fp8 weight outside the fp8 linear layers (an MoE expert's, a router's) "
                "needs its scale (weight_scale or weight_scale_inv), and a scale its weight; "
                "the checkpoint has one without the other")

    def dequantize(self, pair: Fp8Tensor) -> torch.Tensor:
        """The pair's values times their scales, in float32."""
        from loom.quantization.fp8_block import cdiv, dequantize
        name, q, s = pair.name, pair.values, pair.scale.float()
        self.done += 1
        rows, cols = q.shape
        if s.numel() == 1:
            return q.float() * s.reshape(())
        if s.numel() == rows and (s.dim() == 1 or s.shape[1] == 1):
            return q.float() * s.reshape(rows, 1)
        if s.dim() != 2:
            raise ValueError(f"{name}: scale of shape {tuple(s.shape)} fits no fp8 layout for "
                             f"a weight of {tuple(q.shape)}")
        block = self.block or (cdiv(rows, s.shape[0]), cdiv(cols, s.shape[1]))
        if s.shape != (cdiv(rows, block[0]), cdiv(cols, block[1])):
            raise ValueError(f"{name}: a {tuple(s.shape)} scale does not tile a "
                             f"{tuple(q.shape)} weight in {block[0]} x {block[1]} blocks")
        return dequantize(q, s, *block)
