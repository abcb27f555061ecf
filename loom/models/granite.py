"""IBM Granite 3.x dense models (GraniteForCausalLM): Llama's decoder and checkpoint names,
with four scalars from config.json applied where transformers' Granite applies them:

- embedding_multiplier: the token embeddings are multiplied by it;
- residual_multiplier: each attention and MLP output, before it joins the residual
  stream (the add itself happens inside the next norm, `RMSNorm(hidden, residual)`);
- attention_multiplier: the softmax scale, in place of head_dim ** -0.5
  (`ModelArch.attn_scale`);
- logits_scaling: the logits are divided by it.

At tensor parallelism the multiplies sit between each all-reduce and its norm, so the
compile passes that rewrite "all_reduce -> norm" (sequence parallelism, the all-reduce +
norm fusion) find no site in a Granite graph: they leave it as it is and log so.
"""

from __future__ import annotations

import torch

from loom.models.arch import ModelArch
from loom.models.llama import DecoderLayer, DecoderModel, LlamaForCausalLM


class GraniteDecoderLayer(DecoderLayer):
    def __init__(self, arch: ModelArch, layer_idx: int, mlp, **attn_opts) -> None:
        super().__init__(arch, layer_idx, mlp, **attn_opts)
        self.residual_multiplier = arch.residual_multiplier

    def forward(self, positions, hidden, residual):
        """Llama's layer, each branch's output scaled before the add (in the next norm)."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden) * self.residual_multiplier
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden) * self.residual_multiplier, residual


class GraniteModel(DecoderModel):
    def __init__(self, arch: ModelArch, layers: list[GraniteDecoderLayer]) -> None:
        super().__init__(arch, layers)
        self.embedding_multiplier = arch.embedding_multiplier

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embedding_multiplier


class GraniteForCausalLM(LlamaForCausalLM):
    model_cls = GraniteModel

    def make_layer(self, arch: ModelArch, layer_idx: int) -> GraniteDecoderLayer:
        return GraniteDecoderLayer(arch, layer_idx, self.make_mlp(arch, layer_idx),
                                   **self.attn_opts())

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden) / self.arch.logits_scaling
