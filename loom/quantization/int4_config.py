"""Which int4 weight-only scheme (W4A16) a checkpoint's linear layers hold, from its
`quantization_config`. Torch-free, like `loom.quantization.config`, which calls it.

Three checkpoint formats hold the same thing: 4-bit integer weights with a scale (and, for
asymmetric schemes, a 4-bit zero point) per output row per group of input features, the
activations left in the model's dtype:

* compressed-tensors' pack-quantized (llm-compressor's W4A16 and W4A16_ASYM schemes):
  `weight_packed` [out, in / 8], `weight_scale` [out, in / group], `weight_zero_point`
  packed along the output rows;
* AutoAWQ's GEMM layout (`quant_method: awq`): `qweight` [in, out / 8] with its nibbles
  interleaved, `qzeros` [in / group, out / 8], `scales` [in / group, out];
* GPTQ (`quant_method: gptq`, AutoGPTQ's and GPTQModel's layout): `qweight` [in / 8, out],
  `scales` [in / group, out], `qzeros` (unused when symmetric) and `g_idx`, each input
  feature's group: k // group, or with act-order (`desc_act`) groups of features taken in
  the order of their activations' size.

`loom.quantization.int4` reads all three into one layout. What none of loom's kernels run
(8-bit or asymmetric GPTQ, compressed-tensors' g_idx groups, AWQ's GEMV layout, int4
experts) is refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

INT4_METHODS = ("awq", "gptq")
"""quant_method values of int4 checkpoints besides compressed-tensors' pack-quantized."""

ALIASES = {"awq_marlin": "awq", "gptq_marlin": "gptq"}
EXPERTS_INT8 = "experts_int8"
"""`--quantization experts_int8`: an unquantized checkpoint's MoE experts rounded to int8 per
output channel as they load (amax / 127, symmetric), run by the fused MoE's W8A16 kernels;
everything else stays in the model's dtype. ~Half an MoE model's weight bytes."""


def experts_int8_scheme() -> Int4Scheme:
    return Int4Scheme(EXPERTS_INT8, None, False, weights_in_checkpoint=False, bits=8,
                      experts_only=True)
"""vLLM's names for its faster kernels over the same checkpoints: the same here."""


@dataclass(frozen=True)
class Int4Scheme:
    method: str
    """compressed-tensors, awq or gptq: the checkpoint's layout, and what logs call it."""
    group_size: int | None
    """Input features sharing one scale (and zero point); None: one per output row."""
    zero_point: bool
    """Asymmetric: each group has its own zero point; else every zero point is 8."""
    ignore: tuple[str, ...] = ()
    """Checkpoint module names (or "re:" patterns) that stay in the model's dtype."""
    weights_in_checkpoint: bool = True
    """Always: the checkpoint holds the int4 weights (dummy weights are quantized at load)."""
    act_order: bool = False
    """GPTQ's desc_act: each input feature's group is its g_idx entry, not k // group."""
    bits: int = 4
    """4 (W4A16) or 8 (W8A16: GPTQ-Int8, compressed-tensors' W8A16), packed alike."""
    experts_only: bool = False
    """Only the MoE experts are integers, quantized at load (vLLM's `experts_int8`); the
    dense layers keep the model's dtype."""

    def ignores(self, checkpoint_name: str) -> bool:
        return any(re.match(p[3:], checkpoint_name) if p.startswith("re:")
                   else p == checkpoint_name for p in self.ignore)

    def bytes_per_weight(self, dtype_bytes: int) -> float:
        """What one weight costs to read: half a byte, and its share of its group's scale
        (in the model's dtype) and zero point (one byte)."""
        if self.group_size is None:
            return self.bits / 8
        return self.bits / 8 + (dtype_bytes + (1 if self.zero_point else 0)) / self.group_size

    def describe(self) -> str:
        if self.experts_only:
            return (f"MoE experts in int{self.bits} (quantized at load, a scale per output "
                    "channel, activations unquantized), dense layers in the model's dtype")
        groups = ("a scale per output channel" if self.group_size is None
                  else f"a scale per {self.group_size} input features")
        zeros = "zero points" if self.zero_point else "symmetric"
        return (f"int{self.bits} weights ({self.method}, {groups}, {zeros}), activations "
                "unquantized")


def _positive_group(where: str, value: Any) -> int | None:
    """A group size as configs write it: -1 (or None) for one group per row."""
    if value is None or value == -1:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % 8:
        raise ValueError(f"{where}: {value!r} is not a positive multiple of 8 (or -1 for a "
                         "scale per output channel)")
    return value


def _bits(where: str, bits: Any, allowed: tuple[int, ...] = (4, 8)) -> int:
    if bits not in allowed:
        raise ValueError(f"{where}: {bits!r}-bit weights are not supported; loom runs "
                         f"{' or '.join(map(str, allowed))}-bit integer weights here")
    return bits


def awq_scheme(qc: dict[str, Any]) -> Int4Scheme:
    _bits("quantization_config.bits", qc.get("bits", qc.get("w_bit", 4)), (4,))
    version = str(qc.get("version", "gemm")).lower()
    if version != "gemm":
        raise ValueError(f"quantization_config.version: {qc['version']!r}; loom reads "
                         "AutoAWQ's GEMM layout only")
    group = _positive_group("quantization_config.group_size",
                            qc.get("group_size", qc.get("q_group_size", 128)))
    # AutoAWQ never quantizes the LM head; modules_to_not_convert are name fragments.
    ignore = ("lm_head",) + tuple(f"re:.*{re.escape(m)}.*"
                                  for m in qc.get("modules_to_not_convert") or ())
    return Int4Scheme("awq", group, bool(qc.get("zero_point", True)), ignore)


def gptq_scheme(qc: dict[str, Any]) -> Int4Scheme:
    bits = _bits("quantization_config.bits", qc.get("bits", 4))
    if not qc.get("sym", True):
        raise ValueError("quantization_config.sym: asymmetric GPTQ checkpoints are not "
                         "supported; loom runs symmetric GPTQ (or asymmetric AWQ and "
                         "compressed-tensors)")
    if qc.get("lm_head"):
        raise ValueError("quantization_config.lm_head: a quantized LM head is not supported")
    if qc.get("dynamic"):
        raise ValueError("quantization_config.dynamic: per-module GPTQ overrides are not "
                         "supported")
    fmt = qc.get("checkpoint_format", "gptq")
    if fmt not in ("gptq", "gptq_v2"):
        raise ValueError(f"quantization_config.checkpoint_format: {fmt!r} is not gptq")
    group = _positive_group("quantization_config.group_size", qc.get("group_size", 128))
    # One group per row has no order to permute.
    act_order = bool(qc.get("desc_act")) and group is not None
    return Int4Scheme("gptq", group, False, ("lm_head",), act_order=act_order, bits=bits)


def pack_quantized_scheme(where: str, weights: Any) -> tuple[int | None, bool, int]:
    """(group size, zero points, bits) of one compressed-tensors pack-quantized config
    group's weights."""
    if not isinstance(weights, dict):
        raise ValueError(f"{where}: missing")
    if weights.get("type", "int") != "int":
        raise ValueError(f"{where}.type: {weights['type']!r}; pack-quantized weights are int")
    bits = _bits(f"{where}.num_bits", weights.get("num_bits"))
    if weights.get("dynamic"):
        raise ValueError(f"{where}.dynamic: must be false")
    actorder = weights.get("actorder")
    if actorder not in (None, False, "weight", "static"):
        raise ValueError(f"{where}.actorder: {actorder!r} (groups in a permuted order, "
                         "weight_g_idx) is not supported; GPTQ checkpoints with desc_act "
                         "are")
    strategy = weights.get("strategy")
    if strategy == "channel":
        group = None
    elif strategy == "group":
        group = _positive_group(f"{where}.group_size", weights.get("group_size"))
        if group is None:
            raise ValueError(f"{where}.group_size: strategy 'group' needs one")
    else:
        raise ValueError(f"{where}.strategy: {strategy!r} is not one of channel, group")
    return group, not weights.get("symmetric", True), bits
