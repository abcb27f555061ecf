"""GLM-4 (Glm4ForCausalLM: GLM-4-0414, GLM-Z1): Llama's projections (q/k/v with biases,
gate and up fused in the checkpoint) with

- four norms a layer: before and after attention, before and after the MLP;
- a partial rotary embedding (half of each head) over interleaved pairs of features
  (GPT-J's (x0, x1), (x2, x3) ... where Llama rotates x_i with x_(i + d/2)).

loom rotates Llama's way and reorders q's and k's rotated features as they load, evens
first then odds: the same permutation of both leaves every q . k, and so the attention, as
it was, and the pairs land where rotate-half rotates them together
(`loom.models.interleaved_rope`).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from loom.layers.norm import RMSNorm
from loom.models.arch import ModelArch
from loom.models.llama import MLP, DecoderLayer, LlamaForCausalLM
from loom.models.interleaved_rope import InterleavedRopeLoading
from loom.models.phi3 import split_fused


class Glm4DecoderLayer(DecoderLayer):
    def __init__(self, arch: ModelArch, layer_idx: int, **attn_opts) -> None:
        super().__init__(arch, layer_idx, MLP(arch.hidden_size, arch.intermediate_size),
                         **attn_opts)
        self.post_self_attn_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_mlp_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, positions, hidden, residual):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_self_attn_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.post_mlp_layernorm(self.mlp(hidden)), residual


class Glm4ForCausalLM(InterleavedRopeLoading, LlamaForCausalLM):
    def attn_opts(self) -> dict:
        return dict(rotary_emb=self.rotary_emb, qkv_bias=self.arch.attention_bias,
                    o_bias=False, qk_norm=False)

    def make_layer(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        return Glm4DecoderLayer(arch, layer_idx, **self.attn_opts())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(split_fused(weights, self.arch))  # gate_up as gate, up
