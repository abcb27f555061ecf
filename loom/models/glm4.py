"""GLM-4 (Glm4ForCausalLM: GLM-4-0414, GLM-Z1): Llama's projections (q/k/v with biases,
gate and up fused in the checkpoint) with

- four norms a layer: before and after attention, before and after the MLP;
- a partial rotary embedding (half of each head) over interleaved pairs of features
  (GPT-J's (x0, x1), (x2, x3) ... where Llama rotates x_i with x_(i + d/2)).

loom rotates Llama's way and reorders q's and k's rotated features as they load, evens
first then odds: the same permutation of both leaves every q . k, and so the attention, as
it was, and the pairs land where rotate-half rotates them together. Adapters, whose q/k
rows would need the same reordering, are refused (`loom.lora.adapter.model_targets`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from loom.layers.norm import RMSNorm
from loom.models.arch import ModelArch
from loom.models.llama import MLP, DecoderLayer, LlamaForCausalLM
from loom.models.phi3 import split_fused
from loom.models.weights import load_named_weights


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


class Glm4ForCausalLM(LlamaForCausalLM):
    def attn_opts(self) -> dict:
        return dict(rotary_emb=self.rotary_emb, qkv_bias=self.arch.attention_bias,
                    o_bias=False, qk_norm=False)

    def make_layer(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        return Glm4DecoderLayer(arch, layer_idx, **self.attn_opts())

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_named_weights(self, _deinterleaved(split_fused(weights, self.arch),
                                                       self.arch, self.rotary_emb.rotary_dim))


def _deinterleaved(weights: Iterable[tuple[str, torch.Tensor]], arch: ModelArch,
                   rotary_dim: int) -> Iterator[tuple[str, torch.Tensor]]:
    """q_proj's and k_proj's rows (weight and bias) in each head reordered: the rotated
    features' even ones, then their odd ones, then the rest as they were."""
    order = torch.cat([torch.arange(0, rotary_dim, 2), torch.arange(1, rotary_dim, 2),
                       torch.arange(rotary_dim, arch.head_dim)])
    for name, tensor in weights:
        if not name.endswith((".q_proj.weight", ".q_proj.bias", ".k_proj.weight",
                              ".k_proj.bias")):
            yield name, tensor
            continue
        if not tensor.is_floating_point() or tensor.shape[0] % arch.head_dim:
            raise NotImplementedError(f"{arch.architecture}: {name} is quantized or not whole "
                                      "heads; its interleaved rotary rows cannot be reordered")
        heads = tensor.reshape(-1, arch.head_dim, *tensor.shape[1:])
        yield name, heads[:, order].reshape(tensor.shape)
