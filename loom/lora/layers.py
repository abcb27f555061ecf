"""The LoRA term of one linear layer, for every adapter slot at once.

A layer holds `max_loras` slots of rank `max_lora_rank` each. For a batch of T tokens:

    h = x A^T                      [T, slices, slots * rank]  (every slot's A)
    h = h * mask                   each token keeps only its own slot's columns
    y = h B^T                      [T, out]                   (each slice's B rows)

The mask (one row per token, ones over the columns of the token's slot, zeros for the
base model's tokens) is the only thing that changes from step to step, and it is one
persistent buffer shared by every layer: the same code runs eagerly, under torch.compile
and in CUDA graphs, whatever adapters the batch mixes. The price is computing every slot
for every token: slots * rank * (in + out) multiply-adds a token, a few percent of the
layer's own at the default 1 slot of rank 16 on an 8B model; nothing when LoRA is off.
Merged projections (q/k/v, gate/up) keep an A per slice, since PEFT trains them apart.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LoRASlots(nn.Module):
    def __init__(self, in_features: int, out_sizes: list[int], num_slots: int, rank: int,
                 mask: torch.Tensor) -> None:
        """out_sizes: this rank's output rows of each slice, in the weight's order."""
        super().__init__()
        self.out_sizes = out_sizes
        self.num_slots, self.rank = num_slots, rank
        width = num_slots * rank
        self.register_buffer("a", torch.zeros(len(out_sizes) * width, in_features),
                             persistent=False)
        self.register_buffer("b", torch.zeros(sum(out_sizes), width), persistent=False)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = len(self.out_sizes)
        h = F.linear(x, self.a).view(x.shape[0], n, -1) * self.mask[:x.shape[0]].unsqueeze(1)
        if n == 1:
            return F.linear(h[:, 0], self.b)
        return torch.cat([F.linear(h[:, i], b) for i, b in
                          enumerate(self.b.split(self.out_sizes))], dim=1)

    def set_slot(self, slot: int, a: list[torch.Tensor | None], b: torch.Tensor) -> None:
        """Write one adapter into a slot: a, each slice's A ([r, in], None: not adapted);
        b, this rank's B rows ([out, r], zero for slices not adapted), scaling applied."""
        width = self.num_slots * self.rank
        cols = slice(slot * self.rank, (slot + 1) * self.rank)
        a_view = self.a.view(len(self.out_sizes), width, -1)
        a_view[:, cols].zero_()
        for i, a_i in enumerate(a):
            if a_i is not None:
                a_view[i, cols][:a_i.shape[0]].copy_(a_i)
        self.b[:, cols].zero_()
        self.b[:, cols][:, :b.shape[1]].copy_(b)

    def clear_slot(self, slot: int) -> None:
        cols = slice(slot * self.rank, (slot + 1) * self.rank)
        self.a.view(len(self.out_sizes), self.num_slots * self.rank, -1)[:, cols].zero_()
        self.b[:, cols].zero_()
