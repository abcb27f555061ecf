"""Mixtral (the 8x7B / 8x22B layout): Llama attention, and in every layer a routed expert
block, `block_sparse_moe` in the checkpoint (loom's `mlp`; experts w1 gate, w3 up, w2
down, each intermediate_size wide), whose top-k softmax weights are renormalised."""

from __future__ import annotations

from torch import nn

from loom.models.arch import ModelArch
from loom.models.llama import LlamaForCausalLM
from loom.models.qwen3_moe import SparseMoeBlock


class MixtralForCausalLM(LlamaForCausalLM):
    def make_mlp(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        if not arch.is_moe_layer(layer_idx):
            raise ValueError(f"MixtralForCausalLM: layer {layer_idx} has no experts "
                             f"(num_local_experts {arch.num_experts}); every Mixtral layer "
                             "routes to experts")
        return SparseMoeBlock(arch)
