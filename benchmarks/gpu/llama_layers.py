"""Llama-3.1-8B's layer shapes and random weights for them, as the GPU probes time a layer
chain (qkv, o, gate_up, down; the values are not what is timed)."""
import torch

H, KH, D, HID, INTER = 32, 8, 128, 4096, 14336
"""Query heads, KV heads, head dim, hidden size, MLP intermediate size."""


def layer_weights(layers: int, device, dtype=torch.bfloat16) -> list[dict[str, torch.Tensor]]:
    """Each layer's qkv, o, gu (gate and up stacked) and down weights, [out, in]."""
    def w(rows, cols):
        return torch.randn(rows, cols, device=device, dtype=dtype) * 0.02
    return [dict(qkv=w(HID + 2 * KH * D, HID), o=w(HID, H * D), gu=w(2 * INTER, HID),
                 down=w(HID, INTER)) for _ in range(layers)]
