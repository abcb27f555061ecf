"""The LoRA term of one linear layer, for every adapter slot at once.

A layer holds `max_loras` slots of rank `max_lora_rank` each. For a batch of T tokens:

    h = x A^T                      [T, slices * slots * rank]  (every slot's A)
    h = h * mask                   each token keeps only its own slot's columns
    y = h B^T                      [T, out]

The mask (one row per token, ones over the columns of the token's slot, zeros for the
base model's tokens) is the only thing that changes from step to step, and it is one
persistent buffer shared by every layer: the same code runs eagerly, under torch.compile
and in CUDA graphs, whatever adapters the batch mixes. The price is computing every slot
for every token: slots * rank * (in + out) multiply-adds a token, a few percent of the
layer's own at the default 1 slot of rank 16 on an 8B model; nothing when LoRA is off.
Merged projections (q/k/v, gate/up) keep an A per slice, since PEFT trains them apart, and
one block-diagonal B (each slice's rows read only its own columns): one matmul for all
slices rather than one launch each, for a B slices times larger than the nonzero blocks
(1.8 MB a layer for an 8B gate/up at 1 slot of rank 16).

The term is one opaque op, `loom::lora_add(y, x, ...)` = y + the term: on CUDA at decode
rows (1..16) two Triton kernels (`loom.kernels.lora`), three torch kernels otherwise. The
decode GEMV pass can hand it its input's producer (the residual add + RMSNorm before
q/k/v and gate/up, the SiLU·mul before down), so that the GEMV that fuses them into the
base projection keeps doing so with an adapter on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loom.layers.norm import rms_norm
from loom.library import loom_op


class LoRASlots(nn.Module):
    def __init__(self, in_features: int, out_sizes: list[int], num_slots: int, rank: int,
                 mask: torch.Tensor) -> None:
        """out_sizes: this rank's output rows of each slice, in the weight's order."""
        super().__init__()
        self.out_sizes = out_sizes
        self.num_slots, self.rank = num_slots, rank
        width = num_slots * rank
        # Where the mask lives, in its dtype (the model's): the layers are built before
        # the manager, outside any device or dtype context.
        like = dict(dtype=mask.dtype, device=mask.device)
        self.register_buffer("a", torch.zeros(len(out_sizes) * width, in_features, **like),
                             persistent=False)
        self.register_buffer("b", torch.zeros(sum(out_sizes), len(out_sizes) * width, **like),
                             persistent=False)
        self.register_buffer("mask", mask, persistent=False)

    def add(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """y + this layer's term for input x (y: the base projection of x)."""
        args = (y, x, self.a, self.b, self.mask, len(self.out_sizes))
        if torch.compiler.is_compiling():  # one node for the passes to see
            return torch.ops.loom.lora_add(*args)
        return lora_add(*args)

    def set_slot(self, slot: int, a: list[torch.Tensor | None], b: torch.Tensor) -> None:
        """Write one adapter into a slot: a, each slice's A ([r, in], None: not adapted);
        b, this rank's B rows ([out, r], zero for slices not adapted), scaling applied."""
        self.clear_slot(slot)
        a_view, b_view = self._views()
        rank, start = b.shape[1], 0
        for i, (a_i, size) in enumerate(zip(a, self.out_sizes)):
            if a_i is not None:
                a_view[i, slot, :rank].copy_(a_i)
                b_view[start:start + size, i, slot, :rank].copy_(b[start:start + size])
            start += size

    def clear_slot(self, slot: int) -> None:
        a_view, b_view = self._views()
        a_view[:, slot].zero_()
        b_view[:, :, slot].zero_()

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """a as [slice, slot, rank, in]; b as [out, slice, slot, rank]."""
        n = len(self.out_sizes)
        return (self.a.view(n, self.num_slots, self.rank, -1),
                self.b.view(-1, n, self.num_slots, self.rank))


def _use_kernels(x: torch.Tensor) -> bool:
    """Whether the Triton kernels may run for x (a seam: the CPU tests run them through
    Triton's interpreter)."""
    return x.is_cuda


@loom_op("lora_add", "(Tensor y, Tensor x, Tensor a, Tensor b, Tensor mask, int slices, "
         "Tensor? norm_weight=None, float eps=0.0, bool silu_mul=False) -> Tensor")
def lora_add(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
             mask: torch.Tensor, slices: int, norm_weight: torch.Tensor | None = None,
             eps: float = 0.0, silu_mul: bool = False) -> torch.Tensor:
    """y + ((input A^T) * mask) B^T, each of the `slices` blocks of h masked alike. The
    input is x, or silu(gate) * up for x = [gate | up] (silu_mul), or rms_norm(x) *
    norm_weight (x the residual sum). 1..16 rows on CUDA: two kernels; else torch's
    three (the shrink, the mask, the expand adding y)."""
    if _use_kernels(x):
        from loom.kernels import lora as kernels
        if kernels.supports(y, x, a, b, mask):
            return kernels.lora_add(y, x, a, b, mask, norm_weight=norm_weight, eps=eps,
                                    silu_mul=silu_mul)
    if silu_mul:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps)
    t = x.shape[0]
    h = F.linear(x, a).view(t, slices, -1) * mask[:t].unsqueeze(1)
    # One GEMM that adds y (beta = 1): no [T, out] term written and read back for the add,
    # which at a prompt's rows costs what the projection's own output does.
    return torch.addmm(y, h.view(t, -1), b.t())


@lora_add.register_fake
def _(y, x, a, b, mask, slices, norm_weight=None, eps=0.0, silu_mul=False):
    return torch.empty_like(y, memory_format=torch.contiguous_format)
