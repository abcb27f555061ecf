"""Qwen3-MoE (the Qwen3-30B-A3B layout): Qwen3 attention, a routed expert block per layer
except `mlp_only_layers`, no shared experts."""

from __future__ import annotations

import torch
from torch import nn

from loom.layers.linear import ReplicatedLinear
from loom.layers.moe import FusedMoE
from loom.models.arch import ModelArch
from loom.models.llama import MLP, Qwen3ForCausalLM


class SparseMoeBlock(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(arch.hidden_size, arch.num_experts, bias=False)
        self.experts = FusedMoE(arch.num_experts, arch.num_experts_per_tok, arch.hidden_size,
                                arch.moe_intermediate_size, arch.norm_topk_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.gate(x))


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    def make_mlp(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        if arch.is_moe_layer(layer_idx):
            return SparseMoeBlock(arch)
        return MLP(arch.hidden_size, arch.intermediate_size)
