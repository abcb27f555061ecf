"""RMSNorm, with the residual add fused into the same call as in most decoders.

Under torch.compile each norm is one custom-op node (`loom::rms_norm`,
`loom::fused_add_rms_norm`), so compile passes can match "all_reduce -> norm" without
recognising a decomposed pow/mean/rsqrt chain; the last pass turns the remaining nodes
back into aten ops (`compilation/passes/norm_decomposition.py`) so Inductor still fuses
them. Eager runs the reference functions below and never pays custom-op dispatch; on CUDA
the residual add + norm is loom's Triton kernel (`kernels/all_reduce_norm.add_rms_norm`, the
reference's roundings), one launch where the reference is nine torch ops.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from loom.library import loom_op


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Computed in float32 like the reference implementations, then cast back.
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: its weights are offsets from one, and it multiplies in float32
    before casting back (`rms_norm` casts, then multiplies), as transformers' Gemma does."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual), x + residual): the normalised input and the new residual."""
    x = x + residual
    return rms_norm(x, weight, eps), x


class QKNorm(NamedTuple):
    """Per-head RMSNorm of the query and key heads before rotary (Qwen3): each head's
    head_dim values normalised by `rms_norm` with its own weight [head_dim]. Handed to the
    attention op, so that a backend that rotates in its kernels normalises there too."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    eps: float

    def apply(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """query [T, Hq, D] and key [T, Hkv, D], normalised (the reference)."""
        return rms_norm(query, self.q_weight, self.eps), rms_norm(key, self.k_weight, self.eps)


@loom_op("rms_norm", "(Tensor x, Tensor weight, float eps) -> Tensor")
def rms_norm_op(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Contiguous, like the fake below: a kept extern kernel must match its fake strides.
    return rms_norm(x, weight, eps).contiguous()


@rms_norm_op.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape)


@loom_op("fused_add_rms_norm",
         "(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)")
def fused_add_rms_norm_op(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                          eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, residual_out = fused_add_rms_norm(x, residual, weight, eps)
    return out.contiguous(), residual_out.contiguous()


@fused_add_rms_norm_op.register_fake
def _(x, residual, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        compiling = torch.compiler.is_compiling()
        if residual is None:
            fn = torch.ops.loom.rms_norm if compiling else rms_norm
            return fn(x, self.weight, self.eps)
        if compiling:
            return torch.ops.loom.fused_add_rms_norm(x, residual, self.weight, self.eps)
        if x.is_cuda:  # eager CUDA: one Triton launch, where the torch ops above are nine
            from loom.kernels.all_reduce_norm import add_rms_norm
            return add_rms_norm(x, residual, self.weight, self.eps)
        return fused_add_rms_norm(x, residual, self.weight, self.eps)


class GemmaRMSNorm(RMSNorm):
    """`gemma_rms_norm` (weights start at zero: the identity), as plain torch ops, which
    Inductor fuses: loom's norm ops, their compile passes (sequence parallelism, all-reduce
    + norm fusion) and the CUDA add + norm kernel round as Llama's norm does."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return gemma_rms_norm(x, self.weight, self.eps)
        x = x + residual
        return gemma_rms_norm(x, self.weight, self.eps), x
