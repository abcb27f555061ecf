"""IBM Granite 3.x models: dense (GraniteForCausalLM), Llama's decoder and checkpoint names,
and MoE (GraniteMoeForCausalLM: routed experts in every MLP's place); both with four
scalars from config.json applied where transformers' Granite applies them:

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

from collections.abc import Iterable

import torch
from torch import nn

from loom.layers.linear import ReplicatedLinear
from loom.layers.moe import FusedMoE
from loom.models.arch import ModelArch
from loom.models.llama import DecoderLayer, DecoderModel, LlamaForCausalLM


class GraniteDecoderLayer(DecoderLayer):
    def __init__(self, arch: ModelArch, layer_idx: int, mlp, **attn_opts) -> None:
        super().__init__(arch, layer_idx, mlp, **attn_opts)
        self.residual_multiplier = arch.residual_multiplier

    def branch_output(self, out: torch.Tensor) -> torch.Tensor:
        """Each branch's output scaled before the add (in the next norm)."""
        return out * self.residual_multiplier


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


class GraniteMoeBlock(nn.Module):
    """The routed experts (`block_sparse_moe` in the checkpoint, loom's mlp): transformers
    keeps the top-k router logits and softmaxes them, which is the softmax over all experts'
    top k renormalised (FusedMoE's route with renormalize)."""

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.router = ReplicatedLinear(arch.hidden_size, arch.num_experts, bias=False)
        self.experts = FusedMoE(arch.num_experts, arch.num_experts_per_tok, arch.hidden_size,
                                arch.moe_intermediate_size, renormalize=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.experts(x, self.router(x))


class GraniteMoeForCausalLM(GraniteForCausalLM):
    """Granite 3.x MoE (granite-3.x-1b-a400m, 3b-a800m): dense Granite with every MLP a
    routed expert block. The checkpoint stacks each layer's experts: input_linear.weight
    [E, 2I, H] (gate rows, then up) and output_linear.weight [E, H, I]; load_weights splits
    them into per-expert gate / up / down tensors, which FusedMoE slices per rank."""

    def make_mlp(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        return GraniteMoeBlock(arch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(_per_expert(weights))


_STACKED_EXPERTS = {".block_sparse_moe.input_linear.": ("gate_proj", "up_proj"),
                    ".block_sparse_moe.output_linear.": ("down_proj",)}


def _per_expert(weights: Iterable[tuple[str, torch.Tensor]]):
    """GraniteMoe's checkpoint names -> loom's: the router's weight, and each stacked expert
    tensor as one tensor per expert and projection (Mixtral's / Qwen's per-expert names)."""
    for name, tensor in weights:
        name = name.replace(".block_sparse_moe.router.layer.", ".block_sparse_moe.router.")
        fragment = next((f for f in _STACKED_EXPERTS if f in name), None)
        if fragment is None:
            yield name, tensor
            continue
        if not name.endswith(fragment + "weight") or tensor.dim() != 3 \
                or not tensor.is_floating_point() or tensor.element_size() == 1:
            raise ValueError(f"checkpoint tensor {name!r} ({tensor.dtype}, "
                             f"{tuple(tensor.shape)}): loom loads GraniteMoe's stacked experts "
                             "unquantized only (float [experts, rows, cols] weights)")
        projections = _STACKED_EXPERTS[fragment]
        prefix = name[:name.index(fragment)] + ".block_sparse_moe.experts."
        for expert in range(tensor.shape[0]):
            parts = tensor[expert].chunk(len(projections), dim=0)
            for proj, part in zip(projections, parts):
                yield f"{prefix}{expert}.{proj}.weight", part
