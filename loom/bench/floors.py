"""The floors benchmarks are measured against: how long the work would take if it ran at the
device's measured ceilings (matmul rate for compute, copy bandwidth for weight reads).

Conventions, chosen to match the targets in the issues:
- Prefill FLOPs = 2 x `ModelArch.num_params` (the decoder-layer weights one token's matmuls
  touch; no embedding, no LM head, since only the last position reaches the LM head) x tokens,
  plus causal attention: QK^T and PV are 2 matmuls of 2 x head_dim FLOPs per (query, key)
  pair, half the pairs masked: 2 x 2 x layers x heads x head_dim x L^2 / 2 per sequence.
- Decode bytes per step = every weight, embedding and LM head included, x dtype size (x 1
  byte for the projections fp8 quantizes: attention, dense MLPs, shared experts). For a
  MoE model only the experts the batch routes to are read; with uniform top-k routing a batch
  of B tokens touches a fraction 1 - (1 - k/E)^B of each layer's experts. KV-cache reads are
  left out (small beside the weights at the short contexts the targets use).
- Throughput FLOPs = 2 x num_params x every token (prompt and output), no attention term.
- Tensor parallelism divides every floor by tp (perfect scaling, the optimistic floor).
- Under fp8 the compute floors take the measured fp8 matmul rate, for MoE experts too,
  though they stay in bf16 (an optimistic floor for a quantized MoE model).
"""

from __future__ import annotations

from dataclasses import dataclass

from loom.models.arch import ModelArch


@dataclass(frozen=True)
class ParamCounts:
    dense: int
    """Weights every step reads whatever the routing: embeddings, attention, norms, dense
    MLPs, routers, shared experts, LM head."""
    experts: int
    """All routed-expert weights (0 for a dense model)."""
    active: int
    """ModelArch.num_params: decoder-layer weights one token's matmuls touch."""
    linear: int = 0
    """The dense weights fp8 quantizes (attention, dense MLPs, shared experts)."""

    @property
    def total(self) -> int:
        return self.dense + self.experts


def param_counts(arch: ModelArch) -> ParamCounts:
    h, hd = arch.hidden_size, arch.head_dim
    embed = arch.vocab_size * h
    lm_head = 0 if arch.tie_word_embeddings else arch.vocab_size * h
    attn = h * hd * (2 * arch.num_heads + 2 * arch.num_kv_heads)
    if arch.attention_bias:
        attn += hd * (arch.num_heads + 2 * arch.num_kv_heads)
    norms = 2 * h + (2 * hd if arch.architecture.startswith("Qwen3") else 0)
    dense, experts, linear = embed + lm_head + h, 0, 0  # + h: the final norm
    for layer in range(arch.num_layers):
        dense += attn + norms
        linear += attn
        if arch.is_moe_layer(layer):
            dense += h * arch.num_experts  # router
            if arch.shared_expert_intermediate_size:  # Qwen2-MoE's, read for every token
                dense += 3 * h * arch.shared_expert_intermediate_size + h  # + its gate
                linear += 3 * h * arch.shared_expert_intermediate_size
            experts += arch.num_experts * 3 * h * arch.moe_intermediate_size
        else:
            dense += 3 * h * arch.intermediate_size
            linear += 3 * h * arch.intermediate_size
    return ParamCounts(dense=dense, experts=experts, active=arch.num_params, linear=linear)


def expert_fraction(arch: ModelArch, batch_size: int) -> float:
    """Expected share of a layer's experts a batch of `batch_size` tokens reads (uniform routing)."""
    if arch.num_experts == 0:
        return 0.0
    return 1.0 - (1.0 - arch.num_experts_per_tok / arch.num_experts) ** batch_size


def decode_bytes(arch: ModelArch, dtype_bytes: int, batch_size: int,
                 linear_bytes: float | None = None, expert_bytes: float | None = None) -> int:
    """linear_bytes: the element size of the projections and MoE experts fp8 (1) or int4
    (~0.52, with scales) quantizes, if not dtype's (both keep their experts quantized);
    expert_bytes: the experts' alone where they differ (experts_int8: 1)."""
    counts = param_counts(arch)
    experts = counts.experts * expert_fraction(arch, batch_size)
    elem = dtype_bytes if linear_bytes is None else linear_bytes
    per_expert = elem if expert_bytes is None else expert_bytes
    return int((counts.dense - counts.linear) * dtype_bytes + counts.linear * elem
               + experts * per_expert)


def prefill_flops(arch: ModelArch, input_len: int, batch_size: int) -> float:
    linear = 2.0 * arch.num_params * input_len * batch_size
    attention = 2.0 * arch.num_layers * arch.num_heads * arch.head_dim * input_len ** 2
    return linear + attention * batch_size


def prefill_floor_s(arch: ModelArch, input_len: int, batch_size: int,
                    matmul_tflops: float, tp: int) -> float:
    return prefill_flops(arch, input_len, batch_size) / (matmul_tflops * 1e12) / tp


def decode_floor_s(arch: ModelArch, dtype_bytes: int, batch_size: int,
                   copy_tbps: float, tp: int, linear_bytes: float | None = None,
                   expert_bytes: float | None = None) -> float:
    """Seconds per decode step (one token for each of `batch_size` sequences)."""
    return decode_bytes(arch, dtype_bytes, batch_size, linear_bytes,
                        expert_bytes) / (copy_tbps * 1e12) / tp


def throughput_floor_s(arch: ModelArch, total_tokens: int, matmul_tflops: float, tp: int) -> float:
    return 2.0 * arch.num_params * total_tokens / (matmul_tflops * 1e12) / tp
