"""fp8 checkpoint tensors for parameters loom keeps in the model's dtype (MoE experts and
routers: Qwen3's MoE FP8 releases quantize every expert block-wise, llm-compressor's
FP8_DYNAMIC recipes every expert per channel), dequantized with their scales as they load.

The experts then run as the unquantized model's do: the checkpoint's fp8 values times
their scales, exactly (an fp8 value times a float32 scale, rounded once to the model's
dtype), at twice the fp8 bytes. A weight and its scale arrive as two tensors in either
order, so each waits for the other; a static `input_scale` of such a layer has nothing to
scale (its activations stay unquantized) and is dropped. An fp8 weight with no scale, or a
scale with no weight, is an error naming it at the end of the load: never a silent cast.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

_WEIGHT_SCALES = (".weight_scale_inv", ".weight_scale")
_INPUT_SCALE = ".input_scale"


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

    def weight(self, name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        """An fp8 weight: its dequantized values if its scale has arrived, else None."""
        scale = self.scales.pop(name, None)
        if scale is None:
            self.weights[name] = tensor
            return None
        return self._dequantize(name, tensor, scale)

    def add_scale(self, name: str, tensor: torch.Tensor) -> tuple[str, torch.Tensor] | None:
        """A scale with no parameter of its own: (the weight's name, its dequantized values)
        if the weight has arrived, else None (it waits). Input scales are dropped."""
        if name.endswith(_INPUT_SCALE):
            return None
        weight = name[:name.rindex(".weight_scale")] + ".weight"
        pending = self.weights.pop(weight, None)
        if pending is None:
            self.scales[weight] = tensor
            return None
        return weight, self._dequantize(weight, pending, tensor)

    def check_done(self) -> None:
        if self.done:
            logger.info("fp8 checkpoint: %d weights of layers loom keeps in the model's dtype "
                        "(MoE experts, routers) dequantized with their scales as they loaded",
                        self.done)
        if self.weights or self.scales:
            names = sorted(self.weights) + sorted(n + "_scale" for n in self.scales)
            raise ValueError(
                f"checkpoint tensor(s) {', '.join(names[:4])}{' ...' if len(names) > 4 else ''}"
                ": an fp8 weight for a parameter loom keeps in the model's dtype needs its "
                "scale (weight_scale or weight_scale_inv) to be dequantized, and a scale its "
                "weight; the checkpoint has one without the other")

    def _dequantize(self, name: str, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        from loom.quantization.fp8_block import cdiv, dequantize
        self.done += 1
        s = scale.float()
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
