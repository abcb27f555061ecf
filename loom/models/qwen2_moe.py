"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2 attention (QKV bias); in each MoE
layer a routed expert block beside a shared expert, a plain MLP whose output is scaled by
sigmoid(shared_expert_gate(x)); dense MLPs in `mlp_only_layers` and off the
`decoder_sparse_step`."""

from __future__ import annotations

import torch
from torch import nn

from loom.distributed.ops import tp_all_reduce
from loom.layers.linear import ReplicatedLinear
from loom.layers.moe import FusedMoE
from loom.models.arch import ModelArch
from loom.models.llama import MLP, Qwen2ForCausalLM


class SharedExpertMoeBlock(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        h = arch.hidden_size
        self.gate = ReplicatedLinear(h, arch.num_experts, bias=False)
        # Both halves leave their partial sums unreduced: one all-reduce of their total
        # instead of one each (the sigmoid scale is the same on every rank, so it may be
        # applied before the sum).
        self.experts = FusedMoE(arch.num_experts, arch.num_experts_per_tok, h,
                                arch.moe_intermediate_size, arch.norm_topk_prob,
                                reduce_results=False)
        self.shared_expert = MLP(h, arch.shared_expert_intermediate_size, reduce_results=False)
        self.shared_expert_gate = ReplicatedLinear(h, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routed = self.experts(x, self.gate(x))
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return tp_all_reduce(routed + shared)


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    def make_mlp(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        if arch.is_moe_layer(layer_idx):
            if not arch.shared_expert_intermediate_size:
                raise ValueError("Qwen2MoeForCausalLM: shared_expert_intermediate_size must "
                                 "be set (every Qwen2-MoE layer with experts has a shared "
                                 "expert)")
            return SharedExpertMoeBlock(arch)
        return MLP(arch.hidden_size, arch.intermediate_size)
