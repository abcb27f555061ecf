"""Softmax top-k routing (Qwen3-MoE) in one kernel.

loom.layers.moe.route in torch ops: a softmax kernel, then torch.topk's two (a radix select
and a sort), then the renormalising divide. At Qwen3-30B-A3B's batch-1 decode they took
~13 us a layer (topk alone 10.7) of a ~84 us layer (run_zz's profile). Here one program
per token reads its row of router logits, takes the softmax in float32 and picks the top k
by k rounds of argmax (the lowest expert index wins a tie), renormalising if asked.

`router_topk` also computes the logits, for a decode batch of up to 8 tokens: a GEMV over
the router weight whose last program to finish routes the batch (a counter, as the GEMV's
"fixup" split sums its slices), so the route costs no launch of its own. At batch-1 decode
the router GEMV and the route kernel were two ~2.5 us launches a layer (run_zza's profile).
With the GEMV table's tile (8 warps) the one launch took 6.9 us (run_zze): the last
program's routing pays for every reduction across warps. So its tiles are measured apart
(`benchmarks/gpu/router_probe.py`) and taken only where they beat the two launches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from loom.kernels import gemv_decode
from loom.kernels.gemv import MAX_M, GemvConfig, fixup_counters
from loom.library import loom_op


@triton.jit
def _route_row(x, ok, experts, TOP_K: tl.constexpr, TOP_K_PAD: tl.constexpr,
               RENORMALIZE: tl.constexpr):
    """One token's routing from its float32 logits x [EXPERTS_PAD] (-inf where not ok):
    (ids, weights) [TOP_K_PAD], the top k in descending order of probability."""
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
    return ids, weights


@triton.jit
def _store_route(ids, weights, weights_ptr, ids_ptr, token, TOP_K: tl.constexpr,
                 TOP_K_PAD: tl.constexpr):
    ks = tl.arange(0, TOP_K_PAD)
    out = token * TOP_K + ks
    tl.store(ids_ptr + out, ids.to(ids_ptr.dtype.element_ty), mask=ks < TOP_K)
    tl.store(weights_ptr + out, weights, mask=ks < TOP_K)


@triton.jit
def _route_kernel(logits_ptr, weights_ptr, ids_ptr, stride_l, num_experts,
                  TOP_K: tl.constexpr, TOP_K_PAD: tl.constexpr, EXPERTS_PAD: tl.constexpr,
                  RENORMALIZE: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, EXPERTS_PAD)
    ok = experts < num_experts
    x = tl.load(logits_ptr + token * stride_l + experts, mask=ok,
                other=-float("inf")).to(tl.float32)
    ids, weights = _route_row(x, ok, experts, TOP_K, TOP_K_PAD, RENORMALIZE)
    _store_route(ids, weights, weights_ptr, ids_ptr, token, TOP_K, TOP_K_PAD)


@triton.jit
def _router_topk_kernel(x_ptr, w_ptr, logits_ptr, weights_ptr, ids_ptr, count_ptr,
                        M: tl.constexpr, M_PAD: tl.constexpr, K: tl.constexpr,
                        E: tl.constexpr,
                        EXPERTS_PAD: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                        TOP_K: tl.constexpr, TOP_K_PAD: tl.constexpr,
                        RENORMALIZE: tl.constexpr):
    # Program i: logits of experts [i * BLOCK_N, (i + 1) * BLOCK_N) for the M tokens x
    # [M, K] (rows padded to M_PAD, a power of two), each a float32 sum of its row of w [E, K] times x, rounded to x's dtype (what
    # the linear layer returns), stored to logits [M, E]. The last program to arrive routes
    # every token from them.
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_ld = tl.minimum(rows, E - 1)  # clamped, not masked: only the store is
    mcols = tl.arange(0, M_PAD)
    acc = tl.zeros([BLOCK_N, M_PAD], dtype=tl.float32)
    w_ptrs = w_ptr + rows_ld.to(tl.int64)[:, None] * K + tl.arange(0, BLOCK_K)[None, :]
    for i in tl.range(0, (K + BLOCK_K - 1) // BLOCK_K, num_stages=NUM_STAGES):
        ks = i * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        wf = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0).to(tl.float32)
        for m in tl.static_range(M):
            xm = tl.load(x_ptr + m * K + ks, mask=k_ok, other=0.0).to(tl.float32)
            part = tl.sum(wf * xm[None, :], axis=1)
            acc += tl.where(mcols[None, :] == m, part[:, None], 0.0)
        w_ptrs += BLOCK_K
    out = mcols[None, :] * E + rows[:, None]
    tl.store(logits_ptr + out, acc.to(logits_ptr.dtype.element_ty),
             mask=(rows < E)[:, None] & (mcols < M)[None, :])
    # The semaphore of the GEMV's fixup: every thread's logits stored before the barrier,
    # the counter's release after it.
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    if arrived == tl.num_programs(0) - 1:
        experts = tl.arange(0, EXPERTS_PAD)
        ok = experts < E
        for m in tl.static_range(M):
            # .cg: from L2, where the other programs' logits are, never from L1.
            x = tl.load(logits_ptr + m * E + experts, mask=ok, other=-float("inf"),
                        cache_modifier=".cg").to(tl.float32)
            ids, weights = _route_row(x, ok, experts, TOP_K, TOP_K_PAD, RENORMALIZE)
            _store_route(ids, weights, weights_ptr, ids_ptr, m, TOP_K, TOP_K_PAD)
        tl.store(count_ptr, 0)  # ready for the next call


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
        _route_kernel[(num_tokens,)](
            logits, weights, ids, logits.stride(0), num_experts, TOP_K=top_k,
            TOP_K_PAD=triton.next_power_of_2(top_k),
            EXPERTS_PAD=triton.next_power_of_2(num_experts), RENORMALIZE=renormalize,
            num_warps=1 if num_experts <= 256 else 4)
    return weights, ids


def router_topk(x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool,
                config: GemvConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """route_topk(x @ weight^T, ...) for x [M, K] and a router weight [E, K] of x's dtype.
    One launch with config (a GemvConfig; its split and dot fields are not used), or where
    the router table has a config for the shape at M (`benchmarks/gpu/router_probe.py`:
    measured to beat the two launches); otherwise the decode linear
    (`gemv_decode.linear`) and then route_topk."""
    m, k = x.shape
    num_experts = weight.shape[0]
    if weight.dim() != 2 or weight.shape[1] != k or weight.dtype != x.dtype:
        raise ValueError(f"router_topk: weight must be [E, {k}] of {x.dtype}, got "
                         f"{tuple(weight.shape)} {weight.dtype}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"router_topk: top_k must be in 1..{num_experts}, got {top_k}")
    if config is None and 1 <= m <= MAX_M:
        config = gemv_decode.tuned_config(m, num_experts, k, x.dtype, x.device,
                                          kind="router_topk")
    if config is None or not 1 <= m <= MAX_M:
        return route_topk(gemv_decode.linear(x, weight), top_k, renormalize)
    x, weight = x.contiguous(), weight.contiguous()
    logits = torch.empty(m, num_experts, dtype=x.dtype, device=x.device)
    weights = torch.empty(m, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(m, top_k, dtype=torch.int64, device=x.device)
    _router_topk_kernel[(triton.cdiv(num_experts, config.block_n),)](
        x, weight, logits, weights, ids, fixup_counters(x.device, 1),
        M=m, M_PAD=triton.next_power_of_2(m), K=k, E=num_experts,
        EXPERTS_PAD=triton.next_power_of_2(num_experts), BLOCK_N=config.block_n,
        BLOCK_K=min(config.block_k, triton.next_power_of_2(k)),
        NUM_STAGES=config.num_stages, TOP_K=top_k, TOP_K_PAD=triton.next_power_of_2(top_k),
        RENORMALIZE=renormalize, num_warps=config.num_warps, num_stages=config.num_stages)
    return weights, ids


@loom_op("route_topk", "(Tensor router_logits, int top_k, bool renormalize) -> (Tensor, Tensor)")
def route_topk_op(router_logits: torch.Tensor, top_k: int,
                  renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """route_topk as one opaque operator for compiled graphs."""
    return route_topk(router_logits, top_k, renormalize)


@route_topk_op.register_fake
def _(router_logits, top_k, renormalize):
    return _fake_route(router_logits, top_k)


def _fake_route(x: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (x.shape[0], top_k)
    return x.new_empty(shape, dtype=torch.float32), x.new_empty(shape, dtype=torch.int64)


@loom_op("router_topk",
         "(Tensor x, Tensor weight, int top_k, bool renormalize) -> (Tensor, Tensor)")
def router_topk_op(x: torch.Tensor, weight: torch.Tensor, top_k: int,
                   renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """router_topk as one opaque operator: its path is chosen per call from the real token
    count (under CUDA graphs, per captured size)."""
    return router_topk(x, weight, top_k, renormalize)


@router_topk_op.register_fake
def _(x, weight, top_k, renormalize):
    return _fake_route(x, top_k)
