"""Phi-3 / Phi-3.5 (mini, medium): Llama's decoder, with checkpoints that hold q/k/v as one
`qkv_proj` and gate/up as one `gate_up_proj`, and LongRoPE (`make_rotary`) for the 128k
context models. loom's projections are stacked the same way; the fused tensors are cut
back into the checkpoint names Llama's have so that each lands through its shard's loader
(at tensor parallelism each rank's slice of q, k and v is not a slice of the fused rows).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch

from loom.models.arch import ModelArch
from loom.models.llama import LlamaForCausalLM
from loom.models.weights import load_named_weights


def split_fused(weights: Iterable[tuple[str, torch.Tensor]],
                arch: ModelArch) -> Iterator[tuple[str, torch.Tensor]]:
    """Phi-3's fused qkv_proj and gate_up_proj tensors as q/k/v and gate/up ones."""
    q, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    parts = {".qkv_proj.": ((".q_proj.", q), (".k_proj.", kv), (".v_proj.", kv)),
             ".gate_up_proj.": ((".gate_proj.", arch.intermediate_size),
                                (".up_proj.", arch.intermediate_size))}
    for name, tensor in weights:
        fused = next((f for f in parts if f in name), None)
        if fused is None:
            yield name, tensor
            continue
        names, sizes = zip(*parts[fused])
        if tensor.numel() == 1:  # an fp8 checkpoint's per-tensor scale: each part's too
            yield from ((name.replace(fused, part), tensor) for part in names)
            continue
        if tensor.shape[0] != sum(sizes):
            raise ValueError(f"checkpoint tensor {name!r} has {tensor.shape[0]} rows; the "
                             f"model's config makes {' + '.join(map(str, sizes))}")
        for part, piece in zip(names, tensor.split(sizes)):
            yield name.replace(fused, part), piece


class Phi3ForCausalLM(LlamaForCausalLM):
    fused_checkpoint = True
    """The checkpoint's q/k/v and gate/up are one tensor each, split as they load."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_named_weights(self, split_fused(weights, self.arch))
