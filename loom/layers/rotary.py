"""Rotary position embeddings (rotate-half layout), with Llama 3's, linear and YaRN
frequency scaling and per-frequency divisors (LongRoPE's factors). A partial rotary
embedding (Phi-4-mini's partial_rotary_factor) rotates each head's first rotary_dim
features and passes the rest through: its table is rotary_dim wide, which is how every
user of the table tells."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(mid, smoothed, out)


def _yarn_inv_freq(pos_freqs: torch.Tensor, head_dim: int, base: float,
                   scaling: dict) -> torch.Tensor:
    """YaRN (`arch_rope.yarn_scaling`'s dict): the frequencies that turn fewer than
    beta_slow times over the pretraining length are interpolated (divided by the factor),
    those that turn more than beta_fast times kept, a linear ramp over the dimensions
    between."""
    factor, original = scaling["factor"], scaling["original_max_position_embeddings"]

    def dim_at(turns: float) -> float:  # the dimension that turns `turns` times
        return head_dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_at(scaling["beta_fast"]), dim_at(scaling["beta_slow"])
    if scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp
    return 1.0 / (factor * pos_freqs) * (1 - kept) + 1.0 / pos_freqs * kept


def _scaled_inv_freq(head_dim: int, base: float, scaling: dict | None,
                     divisors: Sequence[float] | None) -> torch.Tensor:
    # float32 throughout, as the reference implementation computes it, so positions agree bitwise-close.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if divisors is not None:
        if scaling is not None:
            raise ValueError("rotary embedding: per-frequency divisors replace rope_scaling, "
                             "not combine with it")
        if len(divisors) != head_dim // 2:
            raise ValueError(f"rope_scaling: {len(divisors)} LongRoPE factors for "
                             f"{head_dim // 2} rotary frequencies (head_dim {head_dim})")
        return 1.0 / (torch.tensor(divisors, dtype=torch.float32) * base ** exponents)
    inv_freq = 1.0 / base ** exponents
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "yarn":
        return _yarn_inv_freq(base ** exponents, head_dim, base, scaling)
    if kind == "dynamic":  # `arch_rope.dynamic_scaling`: the base at the scaled context
        factor = scaling["factor"]
        return 1.0 / (base * (factor * factor - factor + 1) ** (head_dim / (head_dim - 2))) \
            ** exponents
    raise ValueError(f"rope_scaling type {kind!r} is not supported (default, linear, llama3, "
                     "dynamic, yarn, longrope)")


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_position: int, base: float,
                 scaling: dict | None = None, divisors: Sequence[float] | None = None,
                 magnitude: float = 1.0, rotary_dim: int | None = None) -> None:
        """divisors: one per frequency, dividing it (LongRoPE's factors), instead of
        scaling; magnitude: a factor on cos and sin (LongRoPE's attention factor), kept in
        the table so that every backend, fused rotary kernels included, applies it;
        rotary_dim: the features of each head rotated (None: all of them), the frequencies
        spread over those as transformers spreads them."""
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim or head_dim
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= head_dim:
            raise ValueError(f"rotary embedding: rotary_dim {self.rotary_dim} must be even "
                             f"and at most head_dim ({head_dim})")
        inv_freq = _scaled_inv_freq(self.rotary_dim, base, scaling, divisors)
        freqs = torch.outer(torch.arange(max_position, dtype=torch.float32), inv_freq.float())
        cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        if magnitude != 1.0:
            cache = cache * magnitude
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """q [T, Hq, D], k [T, Hk, D] rotated at positions [T]."""
        cos, sin = _cos_sin(self.cos_sin_cache, positions)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)

    def rotate(self, positions: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        """heads [T, H, D] (query and key heads side by side) rotated at positions [T]: one
        op, so the compiled graph rotates them in one kernel rather than one per tensor."""
        return rotate_at(positions, heads, self.cos_sin_cache)


def rotate_at(positions: torch.Tensor, x: torch.Tensor,
              cos_sin_cache: torch.Tensor) -> torch.Tensor:
    """x [T, H, D] rotated at positions [T] by a `RotaryEmbedding.cos_sin_cache`, for code
    that holds only the table (an attention backend without a fused rotary kernel)."""
    return _rotate(x, *_cos_sin(cos_sin_cache, positions))


def _cos_sin(cos_sin_cache: torch.Tensor,
             positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    return cos.unsqueeze(1), sin.unsqueeze(1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rot = 2 * cos.shape[-1]
    if rot < x.shape[-1]:  # partial: the features past rotary_dim pass through
        return torch.cat([_rotate(x[..., :rot], cos, sin), x[..., rot:]], dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def is_partial(model: nn.Module) -> bool:
    """Whether any rotary embedding of model rotates only part of each head (the fused
    rotary kernels rotate whole heads)."""
    return any(isinstance(m, RotaryEmbedding) and m.rotary_dim < m.head_dim
               for m in model.modules())
