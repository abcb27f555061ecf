"""Mixture-of-experts block: softmax top-k routing and experts sharded over the
intermediate dimension (each rank holds a slice of every expert; one all-reduce after).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loom.distributed.ops import tp_all_reduce
from loom.distributed.parallel_state import get_tp_group
from loom.layers.linear import divide, shard_of
from loom.library import loom_op


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """Softmax over experts in float32, keep the top k, optionally renormalise them."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def experts_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Loop over the experts that got tokens; the reference any fused kernel must match."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = ids.flatten()
    token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(ids.shape[1])
    for e in flat_ids.unique().tolist():
        sel = (flat_ids == e).nonzero().squeeze(1)
        tokens = token_of[sel]
        gate, up = F.linear(x[tokens], w13[e]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[e])
        out.index_add_(0, tokens, y.float() * weights.flatten()[sel, None])
    return out.to(x.dtype)


@loom_op("experts_reference",
         "(Tensor x, Tensor w13, Tensor w2, Tensor weights, Tensor ids) -> Tensor")
def experts_reference_op(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                         weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return experts_reference(x, w13, w2, weights, ids)


@experts_reference_op.register_fake
def _(x, w13, w2, weights, ids):
    return x.new_empty(x.shape)


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, reduce_results: bool = True) -> None:
        """reduce_results=False: forward returns this rank's partial sum, for a caller that
        adds more to it before one all-reduce (Qwen2-MoE's shared expert)."""
        super().__init__()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank, tp.world_size
        self.top_k, self.renormalize = top_k, renormalize
        self.reduce_results = reduce_results
        self.shard = divide(intermediate_size, tp.world_size, "MoE intermediate size")
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * self.shard, hidden_size),
                                requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, self.shard), requires_grad=False)
        self.w13.weight_loader = self.weight_loader
        self.w2.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id) -> None:
        """shard_id = (expert, 0 gate | 1 up | None down) for one expert's checkpoint tensor."""
        expert, which = shard_id
        shards = self.tp_size
        if which is None:
            param.data[expert].copy_(shard_of(loaded, 1, self.tp_rank, self.shard, shards,
                                              f"expert {expert} down"))
        else:
            dst = param.data[expert].narrow(0, which * self.shard, self.shard)
            dst.copy_(shard_of(loaded, 0, self.tp_rank, self.shard, shards,
                               f"expert {expert} {('gate', 'up')[which]}"))

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            # One kernel instead of softmax, torch.topk's two and the divide (~13 us a
            # layer at batch-1 decode, run_zz).
            import loom.kernels.moe_route  # noqa: F401  (registers torch.ops.loom.route_topk)
            weights, ids = torch.ops.loom.route_topk(router_logits, self.top_k,
                                                     self.renormalize)
        else:
            weights, ids = route(router_logits, self.top_k, self.renormalize)
        out = self.experts(x, weights, ids)
        return tp_all_reduce(out) if self.reduce_results else out

    def experts(self, x, weights, ids):
        if x.is_cuda:
            # One opaque op: its tile config is chosen at run time from the real token count.
            # Traced, the choice put range guards on the token count, and every batch that
            # crossed one recompiled the whole model (run_m: Qwen3-30B-A3B prompt steps at
            # 12x their floor).
            import loom.kernels.fused_moe  # noqa: F401  (registers torch.ops.loom.fused_moe)
            return torch.ops.loom.fused_moe(x, self.w13, self.w2, weights, ids)
        # The reference loops over the experts present (data-dependent): one opaque node
        # under torch.compile, so the CPU graph traces whole.
        if torch.compiler.is_compiling():
            return torch.ops.loom.experts_reference(x, self.w13, self.w2, weights, ids)
        return experts_reference(x, self.w13, self.w2, weights, ids)
