"""Llama-3.1-8B's layer shapes and random weights for them, as the GPU probes time a layer
chain (qkv, o, gate_up, down; the values are not what is timed)."""
import torch
import torch.nn.functional as F

H, KH, D, HID, INTER = 32, 8, 128, 4096, 14336
"""Query heads, KV heads, head dim, hidden size, MLP intermediate size."""


def layer_weights(layers: int, device, dtype=torch.bfloat16) -> list[dict[str, torch.Tensor]]:
    """Each layer's qkv, o, gu (gate and up stacked) and down weights, [out, in]."""
    def w(rows, cols):
        return torch.randn(rows, cols, device=device, dtype=dtype) * 0.02
    return [dict(qkv=w(HID + 2 * KH * D, HID), o=w(HID, H * D), gu=w(2 * INTER, HID),
                 down=w(HID, INTER)) for _ in range(layers)]


def layer_chain(x: torch.Tensor, weights, mm=None, attend=None, decodes: int = 0):
    """The layers' GEMMs over x, mm(a, w) = a @ w.T (torch's where None). The last `decodes`
    rows' q columns go through attend(q [decodes, H, D]) in line, as loom's merged step does;
    the other rows pass their q columns through."""
    mm = mm or (lambda a, w: a @ w.t())
    for w in weights:
        q = mm(x, w["qkv"])[:, :H * D]
        if decodes:
            o = attend(q[-decodes:].reshape(decodes, H, D)).reshape(decodes, H * D)
            q = torch.cat([q[:-decodes], o]) if decodes < len(x) else o
        x = mm(q, w["o"]) + x
        gu = mm(x, w["gu"])
        x = mm(F.silu(gu[:, :INTER]) * gu[:, INTER:], w["down"])
    return x
