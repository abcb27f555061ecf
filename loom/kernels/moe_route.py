"""Softmax top-k routing (Qwen3-MoE) in one kernel.

loom.layers.moe.route in torch ops: a softmax kernel, then torch.topk's two (a radix select
and a sort), then the renormalising divide. At Qwen3-30B-A3B's batch-1 decode they took
~13 us a layer (topk alone 10.7) of a ~84 us layer (run_zz's profile). Here one program
per token reads its row of router logits, takes the softmax in float32 and picks the top k
by k rounds of argmax (the lowest expert index wins a tie), renormalising if asked.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels.host import next_power_of_2
from loom.kernels.launch import fast_launch
from loom.library import loom_op


@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, stride_l, num_experts,
                  TOP_K: tl.constexpr, TOP_K_PAD: tl.constexpr, EXPERTS_PAD: tl.constexpr,
                  RENORMALIZE: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, EXPERTS_PAD)
    ok = experts < num_experts
    x = tl.load(logits_ptr + token * stride_l + experts, mask=ok,
                other=-float("inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    left = tl.where(ok, p / tl.sum(p, axis=0), -1.0)  # padding never wins, not even over 0
    ks = tl.arange(0, TOP_K_PAD)
    ids = tl.zeros([TOP_K_PAD], tl.int32)
    weights = tl.zeros([TOP_K_PAD], tl.float32)
    for k in tl.static_range(TOP_K):
        best = tl.argmax(left, axis=0, tie_break_left=True)
        ids = tl.where(ks == k, best, ids)
        weights = tl.where(ks == k, tl.max(left, axis=0), weights)
        left = tl.where(experts == best, -1.0, left)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, axis=0)
    out = token * TOP_K + ks
    tl.store(ids_ptr + out, ids.to(ids_ptr.dtype.element_ty), mask=ks < TOP_K)
    tl.store(weights_ptr + out, weights, mask=ks < TOP_K)


def route_topk(router_logits: torch.Tensor, top_k: int,
               renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 [T, top_k], ids int64 [T, top_k]) as loom.layers.moe.route gives
    them, the top k in descending order of probability."""
    num_tokens, num_experts = router_logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"route_topk: top_k must be in 1..{num_experts}, got {top_k}")
    logits = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=logits.device)
    if num_tokens:
        fast_launch(_route_kernel, (num_tokens,))(
            logits, weights, ids, logits.stride(0), num_experts, TOP_K=top_k,
            TOP_K_PAD=next_power_of_2(top_k), EXPERTS_PAD=next_power_of_2(num_experts), RENORMALIZE=renormalize,
            num_warps=1 if num_experts <= 256 else 4)
    return weights, ids


@loom_op("route_topk", "(Tensor router_logits, int top_k, bool renormalize) -> (Tensor, Tensor)")
def route_topk_op(router_logits: torch.Tensor, top_k: int,
                  renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """route_topk as one opaque operator for compiled graphs."""
    return route_topk(router_logits, top_k, renormalize)


@route_topk_op.register_fake
def _(router_logits, top_k, renormalize):
    shape = (router_logits.shape[0], top_k)
    return (router_logits.new_empty(shape, dtype=torch.float32),
            router_logits.new_empty(shape, dtype=torch.int64))
