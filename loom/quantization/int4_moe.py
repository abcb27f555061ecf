"""int4 MoE experts at load (W4A16: Qwen3-30B-A3B's AWQ and GPTQ releases quantize every
expert's gate, up and down projections as they do the dense layers').

Each FusedMoE's stacked weights become loom's int4 layout (`loom.quantization.int4`) per
expert: `w13` packed int32 [E, 2I / TP, H / 8] and `w2` [E, H, I / TP / 8], their scales
`w13_scale` / `w2_scale` [E, rows, in / group] in the model's dtype and, for asymmetric
checkpoints, zero points `w13_zero` / `w2_zero` (uint8, same shape). The fused MoE kernels
read them as they are (`loom.kernels.moe_quant`); the CPU reference dequantizes the
experts a batch uses.

One expert's checkpoint tensor arrives at a time (`models.weights` names it
`experts.w13_scale` and so on for an int4 model): it is turned into loom's layout by the
dense layers' converters (`int4_layouts`), then this rank keeps its rows of gate and up,
or its whole groups of down's input features. Tensors loom does not keep (GPTQ's symmetric
qzeros and g_idx, compressed-tensors' weight_shape) are checked and dropped; act-order
experts are refused. Dummy weights are drawn into one layer's stacked weight in the model's
dtype and rounded to int4 expert by expert.
"""

from __future__ import annotations

import torch
from torch import nn

from loom.layers.linear import shard_of
from loom.layers.moe import FusedMoE
from loom.models.weights import INT4_EXPERT_SUFFIXES
from loom.quantization import int4_layouts as layouts
from loom.quantization.int4 import _NAMES, Int4Linear, _raw, per_word, quantize_int4
from loom.quantization.int4_config import Int4Scheme
from loom.quantization.staging import StagedWeight

_KINDS = ("packed", "scale", "zero")
_ATTRS = {"packed": "", "scale": "_scale", "zero": "_zero"}
"""What the int4 tensors of w13 (w2) are called on a FusedMoE: w13, w13_scale, w13_zero."""


def prepare_experts(model: nn.Module, scheme: Int4Scheme, from_checkpoint: bool,
                    device: torch.device, keep_ignored: bool = False) -> int:
    """Give every FusedMoE int4 parameters (or a staged placeholder, for dummy weights);
    the number of layers. keep_ignored: experts the ignore list names stay in the model's
    dtype (else they are refused)."""
    from loom.quantization.fp8 import _ignored
    from loom.quantization.fp8_moe import _materialize
    count = 0
    for name, layer in model.named_modules():
        if not isinstance(layer, FusedMoE):
            continue
        if scheme.act_order:
            raise ValueError(f"{name}: act-order int4 experts (desc_act) are not supported")
        experts = [f"{name}.0.{p}_proj" for p in ("gate", "up", "down")]
        if keep_ignored and all(_ignored(e, scheme) for e in experts):
            for attr in ("w13", "w2"):
                _materialize(layer, attr, device)
            continue
        if any(_ignored(e, scheme) for e in experts):
            raise ValueError(f"{name}: the checkpoint leaves these int4 experts unquantized "
                             "(its ignore list), which loom does not run beside int4 layers")
        group = scheme.group_size
        for attr, k in (("w13", layer.hidden_size), ("w2", layer.shard)):
            if k % per_word(scheme.bits) or (group is not None and k % group):
                raise ValueError(f"{name}.{attr}: {k} input features (at tensor-parallel size "
                                 f"{layer.tp_size}) are not whole groups of "
                                 f"{group or k}; use a tensor-parallel size that splits the "
                                 "experts' intermediate size at group boundaries")
        layer.int4 = Int4Linear(scheme)
        for attr in ("w13", "w2"):
            if from_checkpoint:
                _parameters(layer, attr, scheme, device)
            else:
                setattr(layer, attr, _staged(name, layer, attr, device))
        count += 1
    return count


def _group(layer: FusedMoE, attr: str) -> int:
    k = layer.hidden_size if attr == "w13" else layer.shard
    return layer.int4.group_size or k


def _shapes(layer: FusedMoE, attr: str, zero_point: bool, dtype: torch.dtype, bits: int):
    e = layer.num_experts
    rows, k = ((2 * layer.shard, layer.hidden_size) if attr == "w13"
               else (layer.hidden_size, layer.shard))
    groups = k // _group(layer, attr)
    shapes = {"packed": ((e, rows, k // per_word(bits)), torch.int32),
              "scale": ((e, rows, groups), dtype)}
    if zero_point:
        shapes["zero"] = ((e, rows, groups), torch.uint8)
    return shapes


def _parameters(layer: FusedMoE, attr: str, scheme: Int4Scheme, device: torch.device) -> None:
    dtype = layer.params_dtype
    names = dict(zip(_KINDS, _NAMES[scheme.method]))
    convert = layouts.CONVERTERS[scheme.method]
    shapes = _shapes(layer, attr, scheme.zero_point, dtype, scheme.bits)
    for kind, (shape, elem) in shapes.items():
        def loader(p, t, shard_id, name=names[kind]):
            _place(layer, attr, p, convert[name](t, _checkpoint_rows(layer, shard_id),
                                                 scheme.bits), shard_id)
        setattr(layer, attr + _ATTRS[kind],
                _raw(torch.empty(shape, dtype=elem, device=device), loader))
    kept = {names[kind] for kind in shapes}
    for name, check in layouts.CHECKED[scheme.method].items():
        if name in kept:  # (a symmetric GPTQ checkpoint's qzeros are only checked)
            continue

        def checker(p, t, shard_id, check=check):
            full_in = layer.hidden_size if shard_id[1] is not None else layer.shard * layer.tp_size
            check(t, _checkpoint_rows(layer, shard_id), full_in, scheme.group_size,
                  scheme.bits)
        suffix = INT4_EXPERT_SUFFIXES[name]
        setattr(layer, attr + suffix, _raw(torch.empty(0, dtype=torch.int32, device=device),
                                           checker))


def _checkpoint_rows(layer: FusedMoE, shard_id) -> int:
    """Rows of one expert's checkpoint tensor: gate's or up's intermediate size, or down's
    hidden size."""
    return layer.shard * layer.tp_size if shard_id[1] is not None else layer.hidden_size


def _place(layer: FusedMoE, attr: str, param: nn.Parameter, full: torch.Tensor,
           shard_id) -> None:
    """One expert's tensor in loom's layout ([rows, columns], all ranks'): this rank's rows
    of gate or up, or its columns of down (a whole row's one scale column for a scale per
    channel)."""
    expert, which = shard_id
    what = f"expert {expert} {('gate', 'up', 'down')[2 if which is None else which]} int4"
    full = full.to(param.dtype)
    cols = param.shape[2]
    if which is not None:
        part = shard_of(full, 0, layer.tp_rank, layer.shard, layer.tp_size, what)
    elif full.shape[1] == 1 == cols:
        part = full
    else:
        part = shard_of(full, 1, layer.tp_rank, cols, layer.tp_size, what)
    layer.rows_of(param.data, shard_id).copy_(shard_of(part, 1, 0, cols, 1, what))


class _StagedExperts(StagedWeight):
    """A FusedMoE's stacked w13 or w2 while its experts' tensors arrive in the model's
    dtype (`--quantization experts_int8`; dummy weights draw it whole): each expert's gate,
    up or down lands in its rows, and the stack is rounded once every expert's parts are
    in."""

    def __init__(self, name: str, layer: FusedMoE, attr: str, device: torch.device,
                 quantize) -> None:
        super().__init__(name, layer, device, quantize, meta=getattr(layer, attr))
        self.parts = torch.zeros(self.shape[0], 2 if attr == "w13" else 1, dtype=torch.bool)

    def load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id) -> None:
        self.layer.weight_loader(self.tensor(), loaded, shard_id)
        expert, which = shard_id
        self.parts[expert, which or 0] = True
        if bool(self.parts.all()):
            self.parts.zero_()
            self.wrote(0, self.shape[0])

    def missing(self) -> str:
        absent = (~self.parts.all(dim=1)).nonzero().flatten().tolist()
        return (f"{self.name}: the checkpoint left experts {absent[:8]} incomplete, so the "
                "layer's experts cannot be quantized")


def _staged(name: str, layer: FusedMoE, attr: str, device: torch.device) -> nn.Parameter:
    """Dummy weights (or an unquantized checkpoint under experts_int8): one layer's stacked
    weight in the model's dtype, then rounded to int4 (8 bits) expert by expert."""
    def quantize(layer: FusedMoE, staging: torch.Tensor) -> None:
        group = _group(layer, attr)
        parts = [quantize_int4(w, group, layer.int4.zero_point, layer.int4.bits)
                 for w in staging]
        for kind, tensors in zip(_KINDS, zip(*parts)):
            if tensors[0] is not None:
                setattr(layer, attr + _ATTRS[kind],
                        nn.Parameter(torch.stack(tensors), requires_grad=False))
    return _StagedExperts(f"{name}.{attr}", layer, attr, device, quantize).placeholder()
