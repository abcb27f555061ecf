"""Models whose rotary embedding turns interleaved pairs of features (GPT-J's (x0, x1),
(x2, x3) ..., where Llama turns x_i with x_(i + d/2)): GLM-4, ERNIE 4.5.

loom rotates Llama's way and reorders q's and k's rotated features as they load, evens
first then odds: the same permutation of both leaves every q . k, and so the attention, as
it was, and the pairs land where rotate-half turns them together. An adapter's q/k rows
would need the same reordering: `loom.lora.adapter.model_targets` refuses adapters on these
models (`ModelArch.interleaved_rope`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from loom.models.arch import ModelArch
from loom.models.llama import LlamaForCausalLM


def deinterleaved(weights: Iterable[tuple[str, torch.Tensor]], arch: ModelArch,
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


class InterleavedRopeLoading:
    """A LlamaForCausalLM mixin: the checkpoint's q/k rows reordered as they load."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return super().load_weights(deinterleaved(weights, self.arch, self.rotary_emb.rotary_dim))


class Ernie4_5ForCausalLM(InterleavedRopeLoading, LlamaForCausalLM):
    """ERNIE 4.5 dense (0.3B): Llama's layers, with use_bias on every projection."""
