"""fp8 linear layers (W8A8): float8_e4m3fn weights with a scale per output channel, and
activations quantized as they arrive (per token, or by the checkpoint's static scale).

On CUDA the matmul is `torch._scaled_mm` with row-wise scales (one fp8 GEMM at twice
bf16's tensor-core rate, reading half the weight bytes). On the CPU the same quantized
values are multiplied in float32: the correctness reference, checked against
compressed-tensors' own fake quantization.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from loom.layers.linear import ColumnParallelLinear, LinearBase, RowParallelLinear, shard_of
from loom.models.weights import checkpoint_modules
from loom.quantization.config import Fp8Scheme

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
_EPS = torch.finfo(torch.float32).eps


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, cols) -> fp8 values and a float32 scale (rows, 1) per row: amax / 448."""
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=_EPS)
    return _to_fp8(x, scale), scale


def _to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


class Fp8Linear:
    """The matmul of one fp8 layer: quantize the input, multiply, rescale."""

    def __init__(self, activations: str) -> None:
        self.activations = activations

    def quantize_input(self, layer: LinearBase, x: torch.Tensor):
        if self.activations == "token":
            return quantize_rows(x)
        scale = layer.input_scale.reshape(1, 1).expand(x.shape[0], 1)
        return _to_fp8(x, scale), scale

    def apply(self, layer: LinearBase, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        xq, x_scale = self.quantize_input(layer, x2)
        if x.is_cuda:
            # Row-wise scaled fp8 GEMMs write bf16 only.
            y = torch._scaled_mm(xq, layer.weight.t(), scale_a=x_scale,
                                 scale_b=layer.weight_scale.t(), out_dtype=torch.bfloat16)
        else:
            y = (xq.float() @ layer.weight.float().t()) * x_scale * layer.weight_scale.t()
        y = y.to(x.dtype).reshape(*x.shape[:-1], -1)
        return y if bias is None else y + bias


def quantize_model(model: nn.Module, scheme: Fp8Scheme, from_checkpoint: bool) -> list[LinearBase]:
    """Make the model's column- and row-parallel layers fp8, before its weights load.
    from_checkpoint: the weights arrive in fp8 with their scales; else they load in the
    model's dtype and `finish_quantization` quantizes them. Replicated layers (MoE
    routers) and MoE experts stay in the model's dtype. Returns the fp8 layers."""
    method = Fp8Linear(scheme.activations)
    layers, kept = [], []
    for name, layer in model.named_modules():
        if not isinstance(layer, (ColumnParallelLinear, RowParallelLinear)):
            continue
        if _ignored(name, scheme):
            kept.append(name)
            continue
        layer.quant = method
        layers.append(layer)
        if from_checkpoint:
            _fp8_parameters(layer, scheme)
    logger.info("quantization (%s): %s in %d linear layers; %d kept in the model's dtype as "
                "the checkpoint asks%s", scheme.method, scheme.describe(), len(layers),
                len(kept), "; MoE experts and routers stay unquantized"
                if any(n.endswith(".experts") for n, _ in model.named_modules()) else "")
    return layers


def finish_quantization(layers: list[LinearBase]) -> None:
    """Quantize weights that loaded in the model's dtype: one scale per output channel."""
    for layer in layers:
        if layer.weight.dtype == FP8:
            continue
        q, scale = quantize_rows(layer.weight.data)
        layer.weight = nn.Parameter(q, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)


def _ignored(name: str, scheme: Fp8Scheme) -> bool:
    if scheme.ignores(name):  # the checkpoint's module is loom's (Phi-3's fused qkv_proj)
        return True
    names = checkpoint_modules(name)
    ignored = [scheme.ignores(n) for n in names]
    if any(ignored) and not all(ignored):
        raise ValueError(f"quantization_config ignore list: {', '.join(names)} share one "
                         "matmul in loom and must be quantized alike")
    return all(ignored)


def _fp8_parameters(layer: LinearBase, scheme: Fp8Scheme) -> None:
    device = layer.weight.device
    weight = nn.Parameter(torch.empty(layer.weight.shape, dtype=FP8, device=device),
                          requires_grad=False)
    weight.weight_loader = layer.weight_loader
    layer.weight = weight
    layer.weight_scale = nn.Parameter(
        torch.empty(layer.out_features, 1, dtype=torch.float32, device=device),
        requires_grad=False)
    layer.weight_scale.weight_loader = lambda p, t, shard=None: _load_scale(layer, p, t, shard)
    if scheme.activations == "static":
        layer.input_scale = nn.Parameter(torch.zeros(1, dtype=torch.float32, device=device),
                                         requires_grad=False)
        # Stacked projections share one input: the largest of their scales covers it.
        layer.input_scale.weight_loader = lambda p, t, shard=None: p.data.copy_(
            torch.maximum(p.data, t.reshape(1).to(p.device)))


def _load_scale(layer: LinearBase, param: nn.Parameter, loaded: torch.Tensor, shard_id) -> None:
    """A per-channel scale loads as its weight's rows do; a per-tensor one fills them."""
    offset, size, rank, shards = layer.output_rows(shard_id)
    rows = param.data.narrow(0, offset, size)
    if loaded.numel() == 1:
        rows.fill_(loaded.item())
    else:
        rows.copy_(shard_of(loaded.reshape(-1, 1), 0, rank, size, shards,
                            f"{type(layer).__name__} weight_scale"))
