"""Start-up compile of every fused-MoE config a step can pick.

fused_moe picks its tiles per call from the step's token count (the tuned table's nearest
key, else the defaults), and each config is a pair of Triton kernels of its own. The
profile run compiles only the largest batch's config and CUDA-graph capture the decode
sizes', so a step of any other size (a 3000-token prompt, the API server's common case)
compiled its pair in the middle of the step: ~1 s for the 8-warp prompt tiles, every
request in flight waiting. Here every config reachable from 1 to max_num_batched_tokens
tokens is compiled before serving, on several threads at once (Triton's AsyncCompileMode,
as the tuner compiles its grid), without running the grouped GEMMs.
"""

from __future__ import annotations

import logging
import time

import torch

from loom.kernels.compile_pool import compile_pool

logger = logging.getLogger(__name__)


def moe_layer_shapes(model: torch.nn.Module) -> list[torch.nn.Module]:
    """One FusedMoE layer per distinct (expert weights' shapes and dtypes, scale blocks,
    top_k): every layer of a shape compiles the same kernels."""
    from loom.layers.moe import FusedMoE
    layers: dict[tuple, torch.nn.Module] = {}
    for module in model.modules():
        if isinstance(module, FusedMoE):
            key = (tuple(module.w13.shape), tuple(module.w2.shape), module.w13.dtype,
                   module.w2.dtype, module.weight_block, module.top_k)
            layers.setdefault(key, module)
    return list(layers.values())


def reachable_configs(layer: torch.nn.Module, max_tokens: int, multiple: int,
                      device: torch.device) -> list[dict[str, int]]:
    """Each distinct config fused_moe can take for this layer at a token count that is a
    multiple of `multiple` (every forward's, under TP) up to max_tokens, in token order."""
    from loom.kernels.moe_config import get_config
    from loom.kernels.moe_quant import table_dtype
    num_experts, two_inter, _ = layer.w13.shape
    bits = layer.int4.bits if getattr(layer, "int4", None) is not None else 4
    seen: dict[tuple, dict[str, int]] = {}
    for n in range(multiple, max_tokens + 1, multiple):
        cfg = get_config(n, layer.top_k, num_experts, two_inter // 2, layer.activation_dtype,
                         device, weight_dtype=table_dtype(layer.w13, bits))
        seen.setdefault(tuple(sorted(cfg.items())), cfg)
    return list(seen.values())


@torch.inference_mode()
def warm_up_moe(model: torch.nn.Module, max_tokens: int, multiple: int,
                device: torch.device) -> int:
    """Compile every reachable config of every FusedMoE shape (on CUDA: elsewhere the experts
    run in torch); the number compiled, 0 with no MoE layer. A config that fails to compile
    is logged and left to fail again, visibly, in the first step that needs it."""
    layers = moe_layer_shapes(model)
    if not layers:
        return 0
    from loom.kernels import fused_moe
    start = time.perf_counter()
    configs = [reachable_configs(layer, max_tokens, multiple, device) for layer in layers]
    count = sum(map(len, configs))
    try:
        with compile_pool(min(8, count)) as threads:
            for layer, layer_configs in zip(layers, configs):
                # As route_topk hands them over: weights float32, ids int64. 16 tokens:
                # the launch sizes are not specialised on, so any count compiles the same.
                hidden = torch.zeros(16, layer.hidden_size, dtype=layer.activation_dtype,
                                     device=device)
                ids = torch.zeros(16, layer.top_k, dtype=torch.int64, device=device)
                weights = torch.zeros(16, layer.top_k, dtype=torch.float32, device=device)
                for cfg in layer_configs:
                    fused_moe.compile_fused_moe(hidden, layer.w13, layer.w2, weights, ids,
                                                cfg, **layer.quant_args())
    except Exception as e:  # noqa: BLE001 - start-up goes on; the step that needs it fails
        logger.warning("fused_moe warm-up: a config failed to compile (%s: %s); configs "
                       "not compiled here compile at first use", type(e).__name__, e)
        return 0
    logger.info("fused_moe warm-up: %d configs for 1-%d tokens compiled on %d threads in "
                "%.1f s", count, max_tokens, threads or 1, time.perf_counter() - start)
    return count
