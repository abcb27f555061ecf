"""Fused mixture-of-experts MLP (Qwen3-MoE): top-k routed SwiGLU experts, the entry point.

Each (token, k) pair is a "slot" t * top_k + k. A config (loom/kernels/moe_config.py: one
passed in, else a tuned one, else the defaults) picks the kernels for a call of T tokens:
  - the grouped GEMM (loom/kernels/moe_gemm.py): slots sorted by expert and each expert's
    run padded to BLOCK_M rows (loom/kernels/moe_align.py), gate_up and down over those
    tiles, then a sum over k;
  - GEMV = 1, loom/kernels/moe_gemv.py's two kernels: for a handful of tokens, each slot
    reads its expert's rows directly, nothing sorted or padded.
Expert weights may be fp8 with float32 scales, per output channel or per block (W8A16),
or int4 packed eight a word with a scale and zero point per group (W4A16, AWQ / GPTQ /
compressed-tensors releases such as Qwen3-30B-A3B's), or with bits=8 8-bit integers packed
four a word (W8A16: GPTQ-Int8, compressed-tensors' W8A16): loom/kernels/moe_quant.py. The
activations stay in the model's dtype.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from loom.kernels.moe_config import get_config, normalize_config
from loom.kernels.moe_gemm import Launch, moe_launches
from loom.kernels.moe_gemv import moe_gemv_launches
from loom.kernels.moe_quant import (ExpertQuant, check_bits, dequantize_expert, expert_quant,
                                    in_features, table_dtype)
from loom.library import loom_op


def fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
              topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
              w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
              weight_block: tuple[int, int] | list[int] | None = None,
              w13_zero: torch.Tensor | None = None, w2_zero: torch.Tensor | None = None,
              group_size: int | None = None, bits: int = 4,
              config: dict[str, Any] | None = None,
              block_m: int | None = None, block_n: int | None = None,
              block_k: int | None = None, group_m: int | None = None,
              num_warps: int | None = None, num_stages: int | None = None,
              gemv: int | None = None, tma: int | None = None) -> torch.Tensor:
    """sum_k topk_weights[t, k] * (silu(x W_g^T) * (x W_u^T)) W_2^T for expert topk_ids[t, k].

    hidden [T, H]; w13 [E, 2I, H] (gate rows then up rows); w2 [E, H, I];
    topk_weights / topk_ids [T, K]. Returns [T, H] in hidden's dtype.
    fp8 weights (float8_e4m3fn) come with a float32 scale each: per output channel
    ([E, N] or [E, N, 1]) or per weight_block = (rows, cols) block ([E, ceil(N / rows),
    ceil(K / cols)], 128 x 128 if weight_block is None).
    int4 weights (int32: w13 [E, 2I, H / 8], w2 [E, H, I / 8], value k of a row in nibble
    k % 8 of word k // 8) come with group_size G (dividing H and I, a multiple of a power of
    two >= 16; G = K: a scale per output channel), scales [E, N, K / G] in hidden's dtype
    and uint8 zero points of that shape, or None for 8: w = (q - zero) * scale.
    bits=8: 8-bit integer weights packed alike, four a word (w13 [E, 2I, H / 4], w2
    [E, H, I / 4], value k of a row in byte k % 4 of word k // 4), zero points 0..255 or
    None for 128. bits other than 4 or 8: a ValueError; group_size None: each weight's group
    its K (words * 32 / bits) over its scale's width.
    Tiles: `config` (see get_config; None looks up a tuned one), then any of block_m ...
    tma given here on top (block_m, group_m or tma without gemv: the grouped GEMM).
    """
    num_tokens, hidden_size = hidden.shape
    quant = expert_quant(w13, w2, w13_scale, w2_scale, weight_block, w13_zero, w2_zero,
                         group_size, hidden.dtype, bits)
    _check_shapes(hidden, w13, w2, bits)
    if num_tokens == 0:
        return torch.zeros_like(hidden)
    cfg = get_config(num_tokens, topk_ids.shape[1], w13.shape[0], w13.shape[1] // 2,
                     hidden.dtype, hidden.device, config, weight_dtype=table_dtype(w13, bits))
    overrides = {"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k,
                 "GROUP_M": group_m, "num_warps": num_warps, "num_stages": num_stages,
                 "GEMV": gemv, "TMA": tma}
    given = {k: v for k, v in overrides.items() if v is not None}
    if gemv is None and given.keys() & {"BLOCK_M", "GROUP_M", "TMA"}:
        given["GEMV"] = 0  # the grouped GEMM's own knobs ask for it
    if given:  # checked together: BLOCK_N's least value depends on GEMV
        cfg = normalize_config({**cfg, **given})
    return _fused_moe(hidden, w13, w2, topk_weights, topk_ids, cfg, quant)


def _check_shapes(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  bits: int = 4) -> None:
    hidden_size, inter = hidden.shape[1], w13.shape[1] // 2
    per_word = check_bits(bits)
    if hidden.stride(1) != 1 or in_features(w13, bits) != hidden_size \
            or w2.shape[0] != w13.shape[0] \
            or (w2.shape[1], in_features(w2, bits)) != (hidden_size, inter):
        raise ValueError("fused_moe: expected hidden [T, H] (contiguous rows), w13 [E, 2I, H], "
                         f"w2 [E, H, I] (int{bits}: w13 [E, 2I, H / {per_word}], w2 "
                         f"[E, H, I / {per_word}]); got {tuple(hidden.shape)}, "
                         f"{tuple(w13.shape)}, {tuple(w2.shape)}")


@loom_op("fused_moe", "(Tensor hidden, Tensor w13, Tensor w2, Tensor topk_weights, "
                     "Tensor topk_ids, Tensor? w13_scale=None, Tensor? w2_scale=None, "
                     "int[]? weight_block=None, Tensor? w13_zero=None, Tensor? w2_zero=None, "
                     "int? group_size=None, int bits=4) -> Tensor")
def fused_moe_op(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                 topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                 w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                 weight_block: list[int] | None = None, w13_zero: torch.Tensor | None = None,
                 w2_zero: torch.Tensor | None = None,
                 group_size: int | None = None, bits: int = 4) -> torch.Tensor:
    """fused_moe as one opaque operator (`torch.ops.loom.fused_moe`). Called directly,
    fused_moe is traced by torch.compile: its tuned config then comes from the token count
    at trace time, with a range guard per key crossed, and a token count past a guard
    recompiles the graph. Through this op the config is chosen at run time from the real
    token count, each CUDA graph capturing its own, and the graph never recompiles for it."""
    return fused_moe(hidden, w13, w2, topk_weights, topk_ids, w13_scale=w13_scale,
                     w2_scale=w2_scale, weight_block=weight_block, w13_zero=w13_zero,
                     w2_zero=w2_zero, group_size=group_size, bits=bits)


@fused_moe_op.register_fake
def _(hidden, w13, w2, topk_weights, topk_ids, w13_scale=None, w2_scale=None,
      weight_block=None, w13_zero=None, w2_zero=None, group_size=None, bits=4):
    check_bits(bits)
    return hidden.new_empty(hidden.shape)


def compile_fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                      topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                      config: dict[str, Any], *, w13_scale: torch.Tensor | None = None,
                      w2_scale: torch.Tensor | None = None,
                      weight_block: tuple[int, int] | None = None,
                      w13_zero: torch.Tensor | None = None, w2_zero: torch.Tensor | None = None,
                      group_size: int | None = None, bits: int = 4) -> None:
    """Compile both kernels for `config` and these inputs without running them (the
    tuner compiles its whole grid this way, on several threads, before timing any)."""
    num_experts, two_inter, _ = w13.shape
    quant = expert_quant(w13, w2, w13_scale, w2_scale, weight_block, w13_zero, w2_zero,
                         group_size, hidden.dtype, bits)
    _check_shapes(hidden, w13, w2, bits)
    cfg = get_config(hidden.shape[0], topk_ids.shape[1], num_experts, two_inter // 2,
                     hidden.dtype, hidden.device, config,
                     weight_dtype=table_dtype(w13, bits))
    _fused_moe(hidden, w13, w2, topk_weights, topk_ids, cfg, quant, compile_only=True)


def kernel_launches(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                    topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg: dict[str, int],
                    quant: ExpertQuant = ExpertQuant()) -> tuple[list[Launch], torch.Tensor]:
    """The launches cfg asks for: the GEMV kernels' (their output is [T, H]) or the grouped
    GEMM's (moe_launches: one row per slot, [T * top_k, H], still to be summed over k)."""
    launch = moe_gemv_launches if cfg["GEMV"] else moe_launches
    return launch(hidden, w13, w2, topk_weights, topk_ids, cfg, quant)


def _fused_moe(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
               topk_weights: torch.Tensor, topk_ids: torch.Tensor, cfg: dict[str, int],
               quant: ExpertQuant, compile_only: bool = False) -> torch.Tensor | None:
    launches, out = kernel_launches(hidden, w13, w2, topk_weights, topk_ids, cfg, quant)
    for kernel, grid, args, kwargs in launches:
        if compile_only:
            kernel.warmup(*args, grid=grid, **kwargs)
        else:
            kernel[grid](*args, **kwargs)
    if compile_only or cfg["GEMV"]:
        return None if compile_only else out
    return out.view(hidden.shape[0], topk_ids.shape[1], hidden.shape[1]).sum(dim=1)


def moe_reference(hidden: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                  w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                  weight_block: tuple[int, int] | None = None,
                  w13_zero: torch.Tensor | None = None, w2_zero: torch.Tensor | None = None,
                  group_size: int | None = None, bits: int = 4) -> torch.Tensor:
    """The same computation in plain torch, one expert at a time, in fp32 (fp8 and int4 or
    8-bit experts dequantized with their scales, and zero points, first)."""
    check_bits(bits)
    x = hidden.float()
    out = torch.zeros_like(x)
    inter = w13.shape[1] // 2
    for e in torch.unique(topk_ids).tolist():
        token, k = torch.nonzero(topk_ids == e, as_tuple=True)
        w_13 = dequantize_expert(w13, e, w13_scale, weight_block, w13_zero, group_size, bits)
        w_2 = dequantize_expert(w2, e, w2_scale, weight_block, w2_zero, group_size, bits)
        gate_up = x[token] @ w_13.t()
        h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = (h @ w_2.t()) * topk_weights[token, k, None].float()
        out.index_add_(0, token, y)
    return out.to(hidden.dtype)
