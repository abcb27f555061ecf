"""IBM Granite 3.x models: dense (GraniteForCausalLM), Llama's decoder and checkpoint names,
and MoE (GraniteMoeForCausalLM: routed experts in every MLP's place); both with four
scalars from config.json applied where transformers' Granite applies them:

- embedding_multiplier: the token embeddings are multiplied by it;
- residual_multiplier: each attention and MLP output, before it joins the residual
  stream (the add itself happens inside the next norm, `RMSNorm(hidden, residual)`);
- attention_multiplier: the softmax scale, in place of head_dim ** -0.5
  (`ModelArch.attn_scale`);
- logits_scaling: the logits are divided by it.

Once the weights are in, residual_multiplier is folded into each branch's last projection
(o_proj, and down_proj or the experts' w2: their weights times it; `after_loading`) and
embedding_multiplier into the embeddings (a tied LM head's logits divided by it again), so
that at tensor parallelism each all-reduce feeds its norm directly and the compile passes
that rewrite "all_reduce -> norm" (sequence parallelism, async TP, the all-reduce + norm
fusion) find every site, as in Llama. A folded projection says so (`output_scale`): a LoRA
adapter's term added to its output is scaled alike. Quantized projections keep the
multiply (their scales are the checkpoint's), and with it the passes find no site.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from loom.layers.linear import ReplicatedLinear
from loom.layers.moe import FusedMoE
from loom.models.arch import ModelArch
from loom.models.llama import DecoderLayer, DecoderModel, LlamaForCausalLM

logger = logging.getLogger(__name__)


class GraniteDecoderLayer(DecoderLayer):
    def __init__(self, arch: ModelArch, layer_idx: int, mlp, **attn_opts) -> None:
        super().__init__(arch, layer_idx, mlp, **attn_opts)
        self.residual_multiplier = arch.residual_multiplier

    def branch_output(self, out: torch.Tensor) -> torch.Tensor:
        """Each branch's output scaled before the add (in the next norm); nothing once the
        multiplier is folded into the weights (1.0)."""
        return out if self.residual_multiplier == 1.0 else out * self.residual_multiplier


class GraniteModel(DecoderModel):
    def __init__(self, arch: ModelArch, layers: list[GraniteDecoderLayer]) -> None:
        super().__init__(arch, layers)
        self.embedding_multiplier = arch.embedding_multiplier

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        embeds = self.embed_tokens(input_ids)
        m = self.embedding_multiplier
        return embeds if m == 1.0 else embeds * m


class GraniteForCausalLM(LlamaForCausalLM):
    model_cls = GraniteModel

    logits_divisor: float | None = None
    """What the logits are divided by once the embedding multiplier is folded into a tied
    LM head's weights too (logits_scaling times it); None: logits_scaling."""

    def after_loading(self) -> None:
        """Fold residual_multiplier into each branch's last projection and
        embedding_multiplier into the embeddings (module docstring)."""
        m, e = self.arch.residual_multiplier, self.arch.embedding_multiplier
        if m == 1.0 and e == 1.0:
            return
        targets = [(module, param) for layer in self.model.layers
                   for module, params in _branch_ends(layer) for param in params]
        if not all(_plain(module, param) for module, param in targets):
            logger.info("%s: quantized projections keep residual_multiplier as a multiply; "
                        "sequence parallelism and the all-reduce + norm fusion find no site",
                        self.arch.architecture)
            return
        with torch.no_grad():
            for module, param in targets:
                param.mul_(m)
                module.output_scale = m
            self.model.embed_tokens.weight.mul_(e)
        for layer in self.model.layers:
            layer.residual_multiplier = 1.0
        self.model.embedding_multiplier = 1.0
        if self.arch.tie_word_embeddings:  # the LM head's weights are the embeddings
            self.logits_divisor = self.arch.logits_scaling * e

    def make_layer(self, arch: ModelArch, layer_idx: int) -> GraniteDecoderLayer:
        return GraniteDecoderLayer(arch, layer_idx, self.make_mlp(arch, layer_idx),
                                   **self.attn_opts())

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return super().compute_logits(hidden) / (self.logits_divisor or self.arch.logits_scaling)


def _branch_ends(layer: GraniteDecoderLayer) -> list[tuple[nn.Module, list[torch.Tensor]]]:
    """The projections whose outputs end a layer's two branches, with the tensors that
    scale their outputs: o_proj's and the MLP's down_proj's weight and bias, or the
    experts' w2."""
    mlp = layer.mlp
    ends = [layer.self_attn.o_proj] + ([] if hasattr(mlp, "experts") else [mlp.down_proj])
    out = [(m, [p for p in (m.weight, getattr(m, "bias", None)) if p is not None])
           for m in ends]
    return out + ([(mlp.experts, [mlp.experts.w2])] if hasattr(mlp, "experts") else [])


def _plain(module: nn.Module, param: torch.Tensor) -> bool:
    """An unquantized projection: its weight is the model's float values themselves."""
    return (getattr(module, "quant", None) is None and param.dtype.is_floating_point
            and param.dtype.itemsize >= 2 and not param.is_meta)


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
