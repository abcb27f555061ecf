"""EmbeddingGemma (transformers' Gemma3TextModel with use_bidirectional_attention): Gemma 3's
layers, each attending both ways within its request, its local layers to the keys at most
sliding_window // 2 positions away on either side (config.json's window is the whole span,
as transformers reads it for a bidirectional model). It runs as loom's encoders do
(`loom.models.bert`): whole prompts, no KV cache; its checkpoint is a base model's (no LM
head, no model. prefix). The sentence-transformers Dense layers after its pooling are the
pooler's (`loom.models.st_dense`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F

from loom.forward_context import get_forward_context
from loom.layers.attention import Attention
from loom.layers.rotary import rotate_at
from loom.models.arch import ModelArch
from loom.models.bert import Segments, segments_of_step
from loom.models.gemma import Gemma3ForCausalLM


class BidirectionalAttention(Attention):
    """`Attention`'s interface over SDPA within each request (no KV cache): a query sees
    every key of its request, or with a window those at most window // 2 positions away."""

    longest = 2048
    """A profiling run's requests' length (the model's context)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                positions: torch.Tensor | None = None,
                cos_sin_cache: torch.Tensor | None = None, qk_norm=None) -> torch.Tensor:
        if qk_norm is not None:
            raise NotImplementedError("BidirectionalAttention: a fused q/k norm")
        window, softcap = self.opts
        if softcap:
            raise NotImplementedError("BidirectionalAttention: an attention logit softcap")
        heads = [t.reshape(t.shape[0], -1, self.head_dim) for t in (q, k, v)]
        if positions is not None:  # the model left the rotation to the attention op
            heads[:2] = [rotate_at(positions, t, cos_sin_cache) for t in heads[:2]]
        segments, n = _step_segments(heads[0].shape[0], self.longest, heads[0].device)
        mask = segments.mask if window is None else segments.within(window // 2)
        out = F.scaled_dot_product_attention(
            *(segments.pad(t[:n]) for t in heads), attn_mask=mask, scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads)
        out = segments.unpad(out)
        return torch.cat([out, q.new_zeros(q.shape[0] - n, out.shape[1])]) \
            if n < q.shape[0] else out


def _step_segments(rows: int, longest: int, device: torch.device) -> tuple[Segments, int]:
    """The step's request layout, built once a step (kept on its metadata) for every layer."""
    metadata = get_forward_context().attn_metadata
    cached = getattr(metadata, "_loom_segments", None)
    if cached is None:
        cached = segments_of_step(rows, longest, device)
        if metadata is not None:
            metadata._loom_segments = cached
    return cached


class Gemma3TextModel(Gemma3ForCausalLM):
    is_encoder = True

    def __init__(self, arch: ModelArch, max_model_len: int | None = None) -> None:
        super().__init__(arch, max_model_len)
        for layer in self.model.layers:
            old = layer.self_attn.attn
            layer.self_attn.attn = BidirectionalAttention(
                old.num_heads, old.head_dim, old.num_kv_heads, old.layer_idx, old.scale,
                *old.opts)
            layer.self_attn.attn.longest = max_model_len or arch.context_len

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(
            (name if name.startswith("model.") else f"model.{name}", tensor)
            for name, tensor in weights)
