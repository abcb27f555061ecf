"""ModernBERT (ModernBertModel: modernbert-embed, gte-modernbert), an encoder as transformers
computes it: pre-norm layers without biases (the first layer's attention unnormed), rotary
embeddings (one base for the global layers, another for the local ones), local layers that
see at most local_attention // 2 positions either way, a GeGLU MLP, a final norm. It runs
as loom's other encoders do (`loom.models.bert`): whole prompts, no KV cache.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from loom.layers.rotary import RotaryEmbedding
from loom.models.arch import ModelArch
from loom.models.bert import (ACTIVATIONS, Segments, linear32, load_encoder_weights,
                              segments_of_step)


def _norm(arch: ModelArch) -> nn.LayerNorm:
    return nn.LayerNorm(arch.hidden_size, eps=arch.rms_norm_eps, bias=False)


class ModernBertLayer(nn.Module):
    def __init__(self, arch: ModelArch, layer_idx: int, rotary: RotaryEmbedding) -> None:
        super().__init__()
        h, inner = arch.hidden_size, arch.intermediate_size
        self.num_heads, self.head_dim = arch.num_heads, arch.head_dim
        self.attn_norm = _norm(arch) if layer_idx else None
        self.Wqkv = nn.Linear(h, 3 * h, bias=False)
        self.Wo = nn.Linear(h, h, bias=False)
        self.mlp_norm = _norm(arch)
        self.Wi = nn.Linear(h, 2 * inner, bias=False)
        self.mlp_out = nn.Linear(inner, h, bias=False)
        self.window = arch.window(layer_idx)
        self.rotary = rotary
        self.act = ACTIVATIONS[arch.hidden_act]

    def forward(self, x: torch.Tensor, positions: torch.Tensor, segments: Segments,
                masks: dict[int | None, torch.Tensor]) -> torch.Tensor:
        normed = x if self.attn_norm is None else self.attn_norm(x)
        q, k, v = self.Wqkv(normed).view(-1, 3, self.num_heads, self.head_dim).unbind(1)
        q, k = self.rotary(positions, q, k)
        attended = F.scaled_dot_product_attention(
            *(segments.pad(t) for t in (q, k, v)), attn_mask=masks[self.window])
        x = x + self.Wo(segments.unpad(attended))
        value, gate = self.Wi(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.mlp_out(self.act(value) * gate)


class ModernBertModel(nn.Module):
    is_encoder = True

    def __init__(self, arch: ModelArch, max_model_len: int | None = None) -> None:
        super().__init__()
        if arch.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_activation: {arch.hidden_act!r} is not one loom's "
                             f"encoders apply ({', '.join(ACTIVATIONS)})")
        self.arch = arch
        length = max_model_len or arch.context_len
        global_rotary = RotaryEmbedding(arch.head_dim, length, arch.rope_theta)
        local_rotary = RotaryEmbedding(arch.head_dim, length, arch.local_rope_theta or
                                       arch.rope_theta)
        self.tok_embeddings = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.embeddings_norm = _norm(arch)
        self.layers = nn.ModuleList(
            ModernBertLayer(arch, i, local_rotary if arch.window(i) else global_rotary)
            for i in range(arch.num_layers))
        self.final_norm = _norm(arch)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        segments, n = segments_of_step(input_ids.shape[0], self.arch.context_len,
                                       input_ids.device)
        masks = {None: segments.mask}
        for layer in self.layers:
            if layer.window not in masks:
                masks[layer.window] = segments.within(layer.window)
        x = self.embeddings_norm(self.tok_embeddings(input_ids))
        hidden = x[:n]
        for layer in self.layers:
            hidden = layer(hidden, positions[:n], segments, masks)
        hidden = self.final_norm(hidden)
        return torch.cat([hidden, x[n:]]) if n < x.shape[0] else hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_encoder_weights(self, weights, _our_name)


class ModernBertForSequenceClassification(ModernBertModel):
    """ModernBERT's classifier (gte-reranker-modernbert): the encoder, then transformers'
    head on the first row or the rows' mean (classifier_pooling): dense, gelu, norm, and
    the classifier."""

    def __init__(self, arch: ModelArch, max_model_len: int | None = None) -> None:
        super().__init__(arch, max_model_len)
        if arch.num_labels < 1:
            raise ValueError(f"num_labels: {arch.architecture} needs at least one label, "
                             f"got {arch.num_labels}")
        self.classify_row = 0 if arch.classifier_pooling == "cls" else "mean"
        self.head_dense = nn.Linear(arch.hidden_size, arch.hidden_size, bias=False)
        self.head_norm = _norm(arch)
        self.classifier = nn.Linear(arch.hidden_size, arch.num_labels)

    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        x = F.gelu(linear32(self.head_dense, hidden))
        x = F.layer_norm(x, x.shape[-1:], self.head_norm.weight.float(),
                         eps=self.head_norm.eps)
        return linear32(self.classifier, x)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.classify(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_encoder_weights(self, weights, _classifier_name)


def _classifier_name(name: str) -> str | None:
    if name.startswith(("head.", "classifier.")):
        return name.replace("head.dense.", "head_dense.").replace("head.norm.", "head_norm.")
    return _our_name(name)


_RENAMES = (("embeddings.tok_embeddings.", "tok_embeddings."),
            ("embeddings.norm.", "embeddings_norm."), (".attn.Wqkv.", ".Wqkv."),
            (".attn.Wo.", ".Wo."), (".mlp.Wi.", ".Wi."), (".mlp.Wo.", ".mlp_out."))


def _our_name(name: str) -> str | None:
    """transformers' ModernBertModel names (model. in front in its task models) -> loom's;
    None for an MLM or classifier head's."""
    name = name.removeprefix("model.")
    if name.startswith(("head.", "decoder.", "classifier.")):
        return None
    for theirs, ours in _RENAMES:
        name = name.replace(theirs, ours)
    return name
