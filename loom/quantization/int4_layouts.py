"""Each int4 checkpoint layout's tensors in loom's (`loom.quantization.int4`): packed
[rows, in / 8] along the input features, scales and zero points [rows, in / group], for
the whole of a checkpoint shard's rows (the layer then keeps its rank's slice).

* compressed-tensors' pack-quantized is loom's layout, but for the zero points, which are
  packed along the output rows ([ceil(rows / 8), groups]).
* AutoAWQ's GEMM layout is transposed, [in, rows / 8] packed along the output rows, with
  each word's nibbles in the order 0 2 4 6 1 3 5 7; its zero points likewise.
* GPTQ's qweight is loom's packing transposed ([in / 8, rows]); symmetric checkpoints keep
  every zero point at 8 (written as 7 by the original format, which adds one as it reads),
  and g_idx must be the plain group of each input feature (no act-order).

A converter is `f(tensor, rows, bits) -> tensor`, rows being the output rows of the
checkpoint tensor (all ranks'); a check `f(tensor, rows, in_features, group, bits)` raises
ValueError naming what it found. 8-bit weights (GPTQ-Int8, W8A16) pack four to a word the
same ways; AWQ is 4-bit only. W8A8-INT8 checkpoints' MoE experts (signed int8, unpacked,
a scale per row) load into the 8-bit layout too, offset by 128. Dense layers (`loom.quantization.int4`) and MoE experts
(`loom.quantization.int4_moe`) share them.
"""

from __future__ import annotations

import torch

from loom.quantization.int4 import _AWQ_ORDER, PACK, pack, unpack

_AWQ_INVERSE = [_AWQ_ORDER.index(i) for i in range(PACK)]


def _int32(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.dtype != torch.int32:
        raise ValueError(f"int4 checkpoint tensor {name}: {t.dtype}, packed int4 words are "
                         "int32")
    return t


def _ct_zeros(t, rows, bits):
    """[ceil(rows / per word), groups] packed along the rows -> [rows, groups]."""
    return unpack(_int32("weight_zero_point", t).t().contiguous(), bits)[:, :rows].t()


def _awq_unpack(name: str, t: torch.Tensor) -> torch.Tensor:
    """[r, c / 8] in AutoAWQ's nibble order -> [c, r] in loom's orientation (uint8)."""
    u = unpack(_int32(name, t))
    return u.view(u.shape[0], -1, PACK)[..., _AWQ_INVERSE].reshape(u.shape[0], -1).t()


def _offset_int8(t, rows, bits):
    """A W8A8-INT8 checkpoint's signed int8 [rows, in] (its MoE experts, run W8A16) -> loom's
    8-bit words: each value plus 128 (the zero point loom's symmetric 8-bit layout has)."""
    if t.dtype != torch.int8:
        raise ValueError(f"int8 checkpoint's MoE expert weight: {t.dtype}; loom runs the "
                         "experts of a W8A8-INT8 checkpoint in int8, or in the model's dtype "
                         "where its ignore list names them")
    return pack((t.to(torch.int16) + 128).to(torch.uint8), bits)


def _check_weight_shape(t, rows, k, group, bits):
    want = [rows, k]
    if t.tolist() != want:
        raise ValueError(f"weight_shape: {t.tolist()} in the checkpoint; loom's config makes "
                         f"this weight {want}")


def _check_gptq_zeros(t, rows, k, group, bits):
    values, mid = torch.unique(unpack(_int32("qzeros", t), bits)), 1 << (bits - 1)
    if values.numel() != 1 or int(values) not in (mid - 1, mid):
        raise ValueError(f"qzeros: zero points {values.tolist()[:4]} in a symmetric GPTQ "
                         f"checkpoint, whose zero points are all {mid} (stored as {mid - 1})")


def _check_g_idx(t, rows, k, group, bits):
    plain = torch.arange(k, device=t.device) // (group or k)
    if t.shape != plain.shape or not torch.equal(t.to(plain.dtype), plain):
        raise ValueError("g_idx: input features are not in their plain groups (act-order, "
                         "desc_act); loom runs GPTQ checkpoints without act-order")


CONVERTERS = {
    "compressed-tensors": {
        "weight_packed": lambda t, rows, bits: _int32("weight_packed", t),
        "weight_scale": lambda t, rows, bits: t,
        "weight_zero_point": _ct_zeros,
    },
    "awq": {
        "qweight": lambda t, rows, bits: pack(_awq_unpack("qweight", t)),
        "scales": lambda t, rows, bits: t.t(),
        "qzeros": lambda t, rows, bits: _awq_unpack("qzeros", t),
    },
    "gptq": {
        "qweight": lambda t, rows, bits: _int32("qweight", t).t().contiguous(),
        "scales": lambda t, rows, bits: t.t(),
    },
    "int8": {
        "weight": _offset_int8,
        "weight_scale": lambda t, rows, bits: t,
    },
}

CHECKED = {  # checkpoint tensors loom checks and drops
    "compressed-tensors": {"weight_shape": _check_weight_shape},
    "awq": {},
    "gptq": {"qzeros": _check_gptq_zeros, "g_idx": _check_g_idx},
    "int8": {},
}
