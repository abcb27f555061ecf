"""Mixture-of-experts block: softmax top-k routing and experts sharded over the
intermediate dimension (each rank holds a slice of every expert; one all-reduce after).
The experts may be fp8 with float32 scales (loom/quantization/fp8_moe.py loads them so):
the CUDA kernels read them as they are, the CPU reference dequantizes the experts it uses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from loom.distributed.ops import tp_all_reduce
from loom.distributed.parallel_state import get_tp_group
from loom.kernels.moe_quant import dequantize
from loom.layers import linear
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
                      weights: torch.Tensor, ids: torch.Tensor,
                      w13_scale: torch.Tensor | None = None,
                      w2_scale: torch.Tensor | None = None,
                      weight_block: tuple[int, int] | list[int] | None = None,
                      w13_zero: torch.Tensor | None = None,
                      w2_zero: torch.Tensor | None = None, bits: int = 4) -> torch.Tensor:
    """Loop over the experts that got tokens; the reference any fused kernel must match.
    fp8 experts are dequantized one at a time, each value times its scale rounded once to
    x's dtype: what a checkpoint dequantized at load would hold. int4 (or 8-bit: `bits`)
    experts, packed int32 w13 / w2 (`loom.quantization.int4_moe`), likewise, their group
    size the scales' width."""
    acc_dtype = torch.promote_types(x.dtype, torch.float32)
    out = torch.zeros(x.shape, dtype=acc_dtype, device=x.device)
    flat_ids = ids.flatten()
    token_of = torch.arange(x.shape[0], device=x.device).repeat_interleave(ids.shape[1])
    for e in flat_ids.unique().tolist():
        sel = (flat_ids == e).nonzero().squeeze(1)
        tokens = token_of[sel]
        gate, up = F.linear(x[tokens], _expert(w13, w13_scale, e, weight_block, x.dtype,
                                               w13_zero, bits)).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, _expert(w2, w2_scale, e, weight_block, x.dtype,
                                                w2_zero, bits))
        out.index_add_(0, tokens, y.to(acc_dtype) * weights.flatten()[sel, None])
    return out.to(x.dtype)


def _expert(w: torch.Tensor, scale: torch.Tensor | None, e: int, block, dtype: torch.dtype,
            zero: torch.Tensor | None = None, bits: int = 4):
    if scale is None:
        return w[e]
    if w.dtype == torch.int32:
        from loom.quantization import int4
        group = w.shape[-1] * int4.per_word(bits) // scale.shape[-1]
        return int4.dequantize(w[e], scale[e], None if zero is None else zero[e], group,
                               bits).to(dtype)
    return dequantize(w[e], scale[e], None if block is None else tuple(block)).to(dtype)


@loom_op("experts_reference",
         "(Tensor x, Tensor w13, Tensor w2, Tensor weights, Tensor ids, Tensor? w13_scale=None, "
         "Tensor? w2_scale=None, int[]? weight_block=None, Tensor? w13_zero=None, "
         "Tensor? w2_zero=None, int bits=4) -> Tensor")
def experts_reference_op(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                         weights: torch.Tensor, ids: torch.Tensor,
                         w13_scale: torch.Tensor | None = None,
                         w2_scale: torch.Tensor | None = None,
                         weight_block: list[int] | None = None,
                         w13_zero: torch.Tensor | None = None,
                         w2_zero: torch.Tensor | None = None, bits: int = 4) -> torch.Tensor:
    return experts_reference(x, w13, w2, weights, ids, w13_scale, w2_scale, weight_block,
                             w13_zero, w2_zero, bits)


@experts_reference_op.register_fake
def _(x, w13, w2, weights, ids, w13_scale=None, w2_scale=None, weight_block=None,
      w13_zero=None, w2_zero=None, bits=4):
    return x.new_empty(x.shape)


class FusedMoE(nn.Module):
    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 renormalize: bool, reduce_results: bool = True) -> None:
        """reduce_results=False: forward returns this rank's partial sum, for a caller that
        adds more to it before one all-reduce (Qwen2-MoE's shared expert). Built under
        `weights_on_meta` (a model about to be quantized), w13 and w2 have no storage until
        `loom.quantization.fp8_moe` gives them theirs, fp8 or the model's dtype."""
        super().__init__()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank, tp.world_size
        self.top_k, self.renormalize = top_k, renormalize
        self.reduce_results = reduce_results
        self.num_experts, self.hidden_size = num_experts, hidden_size
        self.params_dtype = torch.get_default_dtype()
        """The model's dtype at construction: the activations' once the experts are fp8."""
        self.shard = divide(intermediate_size, tp.world_size, "MoE intermediate size")
        # as column- and row-parallel weights are under `weights_on_meta`
        meta = "meta" if linear.weights_go_on_meta() else None
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * self.shard, hidden_size,
                                            device=meta), requires_grad=False)
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, self.shard, device=meta),
                               requires_grad=False)
        self.w13.weight_loader = self.weight_loader
        self.w2.weight_loader = self.weight_loader
        # fp8 experts' float32 scales (loom/kernels/moe_quant.py has their layouts)
        self.register_parameter("w13_scale", None)
        self.register_parameter("w2_scale", None)
        self.weight_block: tuple[int, int] | None = None
        """(rows, cols) of the scales' blocks; None: a scale per output channel."""
        self.int4 = None
        """int4 experts' method (`loom.quantization.int4_moe`): w13 and w2 packed int32,
        with w13_scale / w2_scale per group and w13_zero / w2_zero if asymmetric."""

    @property
    def activation_dtype(self) -> torch.dtype:
        """The dtype of the tokens the experts take: the weights', unless they are fp8 or
        int4."""
        quantized = self.w13.element_size() == 1 or self.int4 is not None
        return self.params_dtype if quantized else self.w13.dtype

    def quant_args(self) -> dict:
        """The fused MoE's (and the reference's) arguments for quantized experts."""
        args = {"w13_scale": self.w13_scale, "w2_scale": self.w2_scale,
                "weight_block": self.weight_block}
        if self.int4 is not None:
            zero = self.int4.zero_point  # (else w13_zero only checks GPTQ's qzeros)
            args.update(w13_zero=self.w13_zero if zero else None,
                        w2_zero=self.w2_zero if zero else None, bits=self.int4.bits)
        return args

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id) -> None:
        """shard_id = (expert, 0 gate | 1 up | None down) for one expert's checkpoint tensor."""
        self.rows_of(param.data, shard_id).copy_(self.rank_part(loaded, shard_id))

    def rank_part(self, loaded: torch.Tensor, shard_id) -> torch.Tensor:
        """This rank's slice of one expert's checkpoint tensor: its rows of gate or up, its
        columns of down."""
        expert, which = shard_id
        what = f"expert {expert} {('gate', 'up', 'down')[2 if which is None else which]}"
        return shard_of(loaded, 0 if which is not None else 1, self.tp_rank, self.shard,
                        self.tp_size, what)

    def rows_of(self, stacked: torch.Tensor, shard_id, rows: int | None = None) -> torch.Tensor:
        """Where that slice goes in a stacked [E, rows, ...] tensor: the expert's down rows, or
        its gate or up half (`rows` each: this rank's intermediate size unless given)."""
        expert, which = shard_id
        if which is None:
            return stacked[expert]
        rows = self.shard if rows is None else rows
        return stacked[expert].narrow(0, which * rows, rows)

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
        quant = self.quant_args()
        if x.is_cuda:
            # One opaque op: its tile config is chosen at run time from the real token count.
            # Traced, the choice put range guards on the token count, and every batch that
            # crossed one recompiled the whole model (run_m: Qwen3-30B-A3B prompt steps at
            # 12x their floor).
            import loom.kernels.fused_moe  # noqa: F401  (registers torch.ops.loom.fused_moe)
            return torch.ops.loom.fused_moe(x, self.w13, self.w2, weights, ids, **quant)
        # The reference loops over the experts present (data-dependent): one opaque node
        # under torch.compile, so the CPU graph traces whole.
        if torch.compiler.is_compiling():
            return torch.ops.loom.experts_reference(x, self.w13, self.w2, weights, ids, **quant)
        return experts_reference(x, self.w13, self.w2, weights, ids, **quant)
