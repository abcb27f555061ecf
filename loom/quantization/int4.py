"""int4 weight-only linear layers (W4A16): 4-bit integer weights with a scale, and for
asymmetric schemes a zero point, per output row per group of input features; the
activations stay in the model's dtype. `loom.quantization.int4_config` says which
checkpoints hold them. 8-bit weights (W8A16, GPTQ-Int8) take the same path with four
values a word and zero points about 128 (`bits`).

Whatever the checkpoint's layout, a layer holds its weights one way (compressed-tensors'
pack-quantized one, unsigned):

* packed int32 [out, in / 8]: column k's value (0..15) is nibble k % 8 of word k // 8;
* scale [out, in / group] in the model's dtype (one column for a scale per channel);
* zero uint8 [out, in / group], or none: every zero point is 8 (symmetric);

and w[n, k] = (q[n, k] - zero[n, k // group]) * scale[n, k // group]. Each checkpoint
tensor is turned into that layout as it arrives and then sliced like any weight: a
column-parallel layer keeps its ranks' rows, a row-parallel one its rank's columns (whole
groups only: a rank's input features must be a multiple of the group size). The layer's
parameters keep the checkpoint's names (qweight / scales / qzeros, or weight_packed /
weight_scale / weight_zero_point); tensors loom does not need (a symmetric GPTQ
checkpoint's qzeros, its g_idx, compressed-tensors' weight_shape) are checked and dropped.

On CUDA the matmul is `loom::int4_linear` (`loom.kernels.int4_linear`: the integer values
times the activations on the tensor cores, each group's partial sum scaled in float32);
elsewhere the weight is dequantized to float32 and multiplied: the correctness reference,
checked against compressed-tensors' own decompression. Dummy weights are drawn in the
model's dtype and rounded to int4 per group as they arrive.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from loom.layers.linear import ColumnParallelLinear, LinearBase, RowParallelLinear, shard_of
from loom.quantization.int4_config import Int4Scheme
from loom.quantization.staging import materialize, stage

logger = logging.getLogger(__name__)

PACK = 8
"""int4 values per int32 word (8-bit weights: four)."""
_AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
"""AutoAWQ's GEMM layout: nibble i of a word holds column _AWQ_ORDER[i] of its eight."""
_NAMES = {  # method -> (packed, scale, zero) parameter names, as the checkpoint's
    "compressed-tensors": ("weight_packed", "weight_scale", "weight_zero_point"),
    "awq": ("qweight", "scales", "qzeros"),
    "gptq": ("qweight", "scales", "qzeros"),
    "int8": ("weight", "weight_scale", "weight_zero_point"),  # W8A8-INT8's MoE experts
    "experts_int8": ("weight", "weight_scale", "weight_zero_point"),  # quantized at load
}


def check_bits(bits: int, where: str = "int weights") -> int:
    """Values per int32 word (8 int4, 4 int8) for bits 4 or 8; a ValueError naming bits and
    `where` (the caller) for any other width."""
    if bits not in (4, 8):
        raise ValueError(f"{where}: bits must be 4 or 8 (int4 or 8-bit weights packed in "
                         f"int32 words), got bits={bits!r}")
    return 32 // bits


per_word = check_bits
"""Values per int32 word: 8 int4, 4 int8."""


def _shifts(bits: int, device) -> torch.Tensor:
    return torch.arange(0, 32, bits, dtype=torch.int32, device=device)


def unpack(packed: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """int32 [rows, cols / per_word] -> uint8 [rows, cols]: value j of word c (bits
    j * bits ..) as column per_word * c + j."""
    values = (packed.unsqueeze(-1) >> _shifts(bits, packed.device)) & ((1 << bits) - 1)
    return values.reshape(packed.shape[0], -1).to(torch.uint8)


def pack(values: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """uint8 [rows, cols] (0 .. 2^bits - 1, cols a multiple of per_word) -> int32 words."""
    words = (values.to(torch.int32).reshape(values.shape[0], -1, per_word(bits))
             << _shifts(bits, values.device))
    return words.sum(dim=-1, dtype=torch.int32)  # disjoint bits: the sum is their OR


def dequantize(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None,
               group: int, bits: int = 4) -> torch.Tensor:
    """The float32 weight [out, in] a layer's packed tensors hold: (q - zero) * scale, each
    group's from its column; no zero points: 2^(bits - 1)."""
    n, k = packed.shape[0], packed.shape[1] * check_bits(bits, "dequantize")
    q = unpack(packed, bits).reshape(n, k // group, group).float()
    z = float(1 << (bits - 1)) if zero is None else zero.float().unsqueeze(-1)
    return ((q - z) * scale.float().unsqueeze(-1)).reshape(n, k)


class Int4Linear:
    """The matmul of one int4 layer."""

    def __init__(self, scheme: Int4Scheme) -> None:
        self.group_size = scheme.group_size
        self.zero_point = scheme.zero_point
        self.bits = scheme.bits
        self.names = _NAMES[scheme.method]

    def tensors(self, layer: LinearBase):
        packed, scale, zero = self.names
        return (getattr(layer, packed), getattr(layer, scale),
                getattr(layer, zero) if self.zero_point else None)

    def group(self, layer: LinearBase) -> int:
        return self.group_size or layer.in_features

    @staticmethod
    def use_op(x: torch.Tensor) -> bool:
        """`loom::int4_linear` on CUDA; on the CPU the float32 reference (tests run the op
        there under Triton's interpreter)."""
        return x.is_cuda

    def apply(self, layer: LinearBase, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        packed, scale, zero = self.tensors(layer)
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        perm = getattr(layer, "input_perm", None)
        if perm is not None:  # act-order: the features in their groups' order
            x2 = x2.index_select(1, perm)
        if self.use_op(x):  # shapes the kernel does not take were logged at load
            y = torch.ops.loom.int4_linear(x2, packed, scale, zero, self.group(layer),
                                           self.bits)
        else:
            w = dequantize(packed, scale, zero, self.group(layer), self.bits)
            y = (x2.float() @ w.t()).to(x.dtype)
        if x.dim() != 2:
            y = y.reshape(*x.shape[:-1], -1)
        return y if bias is None else y + bias


def quantize_model(model: nn.Module, scheme: Int4Scheme, from_checkpoint: bool,
                   device: torch.device) -> list[LinearBase]:
    """Give the model's column- and row-parallel layers (built under `weights_on_meta`)
    their int4 parameters before the weights load; from_checkpoint False (dummy weights):
    each is rounded to int4 once its rows have arrived in the model's dtype."""
    from loom.quantization.fp8 import quantizable_layers
    if scheme.experts_only:
        return _experts_only(model, scheme, device)
    if getattr(model, "fused_checkpoint", False):
        raise ValueError(f"quantization ({scheme.method}): {type(model).__name__}'s fused "
                         "qkv_proj and gate_up_proj checkpoint tensors are not split in "
                         "int4; int4 checkpoints of this architecture are not supported")
    method = Int4Linear(scheme)
    kernel = _kernel_applies(device)
    layers, kept, fallback = [], [], []
    for name, layer in quantizable_layers(model, scheme, device, kept):
        _check_shape(name, layer, method.group(layer), scheme.bits)
        if scheme.act_order and isinstance(layer, RowParallelLinear) and layer.tp_size > 1:
            raise ValueError(f"{name}: act-order int4 (desc_act, g_idx) in a row-parallel "
                             f"layer at tensor-parallel size {layer.tp_size} is not supported "
                             "(a rank's input features would hold parts of groups); run it "
                             "at tensor-parallel size 1")
        layer.quant = method
        if kernel is not None and not kernel(layer, method):
            fallback.append(name)
        layers.append(layer)
        if from_checkpoint:
            _int4_parameters(layer, scheme, device)
        else:
            stage(name, layer, device, _quantize_staged)
    from loom.quantization import int4_moe
    experts = int4_moe.prepare_experts(model, scheme, from_checkpoint, device)
    model.int4_experts = experts > 0  # models.weights names their tensors for them
    logger.info("quantization (%s): %s in %d linear layers%s; %d kept in the model's dtype "
                "as the checkpoint asks", scheme.method, scheme.describe(), len(layers),
                f" and the experts of {experts} MoE layers" if experts else "", len(kept))
    if fallback:
        logger.warning("int4: %d layers (%s ...) have shapes loom's int4 kernel does not take; "
                       "they dequantize and multiply in float32 (slow)", len(fallback),
                       fallback[0])
    return layers


def _experts_only(model: nn.Module, scheme: Int4Scheme, device: torch.device) -> list:
    """`--quantization experts_int8`: the dense layers get their real weights in the model's
    dtype; each MoE layer's experts are rounded to 8 bits as their rows arrive."""
    from loom.quantization import int4_moe
    for layer in model.modules():
        if isinstance(layer, (ColumnParallelLinear, RowParallelLinear)):
            materialize(layer, device)
    experts = int4_moe.prepare_experts(model, scheme, False, device)
    if experts:
        logger.info("quantization (%s): %s, %d MoE layers", scheme.method, scheme.describe(),
                    experts)
    else:
        logger.warning("quantization (%s): %s has no MoE layers; nothing is quantized",
                       scheme.method, type(model).__name__)
    return []


def _kernel_applies(device: torch.device):
    """On CUDA: whether a layer's shapes suit `loom::int4_linear` (importing the kernel
    registers the op before any graph is traced); None elsewhere."""
    if device.type != "cuda":
        return None
    from loom.kernels import int4_linear

    return lambda layer, method: int4_linear.kernel_applies(
        layer.in_features, method.group(layer), method.bits)


def _check_shape(name: str, layer: LinearBase, group: int, bits: int) -> None:
    k = layer.in_features
    if k % per_word(bits) or k % group:
        where = (f" at tensor-parallel size {layer.tp_size}"
                 if isinstance(layer, RowParallelLinear) and layer.tp_size > 1 else "")
        raise ValueError(f"{name}: {k} input features{where} are not a whole number of "
                         f"groups of {group} (and of words of {per_word(bits)})")


def _raw(tensor: torch.Tensor, loader) -> nn.Parameter:
    p = nn.Parameter(tensor, requires_grad=False)
    p.weight_loader = loader
    p.raw_checkpoint = True  # its checkpoint tensor arrives in the checkpoint's own dtype
    return p


def _int4_parameters(layer: LinearBase, scheme: Int4Scheme, device: torch.device) -> None:
    from loom.quantization import int4_layouts as layouts
    rows, k = layer.out_features, layer.in_features
    groups = k // (scheme.group_size or k)
    dtype = layer.weight.dtype
    layer.weight = None  # the int4 tensors replace it
    names = _NAMES[scheme.method]
    convert = layouts.CONVERTERS[scheme.method]
    shapes = {names[0]: ((rows, k // per_word(scheme.bits)), torch.int32),
              names[1]: ((rows, groups), dtype)}
    if scheme.zero_point:
        shapes[names[2]] = ((rows, groups), torch.uint8)
    for name, (shape, kind) in shapes.items():
        def loader(p, t, shard=None, name=name):
            _place(layer, p, convert[name](t, _shard_rows(layer, shard), scheme.bits), shard)
        setattr(layer, name, _raw(torch.empty(shape, dtype=kind, device=device), loader))
    if scheme.act_order:
        layer.g_idx = _raw(torch.zeros(k, dtype=torch.int32, device=device),
                           lambda p, t, shard=None: _load_g_idx(layer, p, t))
    for name, check in layouts.CHECKED[scheme.method].items():
        if name in shapes or (name == "g_idx" and scheme.act_order):
            continue

        def checker(p, t, shard=None, check=check):
            check(t, _shard_rows(layer, shard), _full_in(layer), scheme.group_size, scheme.bits)
        setattr(layer, name, _raw(torch.empty(0, dtype=torch.int32, device=device), checker))


def _shard_rows(layer: LinearBase, shard) -> int:
    """Output rows of the checkpoint tensor behind shard `shard` (all ranks')."""
    _, size, _, shards = layer.output_rows(shard)
    return size * shards


def _full_in(layer: LinearBase) -> int:
    return layer.in_features * (layer.tp_size if isinstance(layer, RowParallelLinear) else 1)


def _load_g_idx(layer: LinearBase, param: nn.Parameter, loaded: torch.Tensor) -> None:
    """An act-order layer's groups of its input features; stacked projections (q/k/v,
    gate/up) share their input, so GPTQ gives them one order, which loom checks."""
    loaded = loaded.to(torch.int32)
    if tuple(loaded.shape) != tuple(param.shape):
        raise ValueError(f"g_idx: {tuple(loaded.shape)} in the checkpoint; the layer has "
                         f"{param.shape[0]} input features")
    loaded = loaded.to(param.device)
    if getattr(layer, "g_idx_loaded", False) and not torch.equal(param.data, loaded):
        raise ValueError("g_idx: the stacked projections (q/k/v or gate/up) of one layer have "
                         "different act orders; loom multiplies them as one matrix")
    param.data.copy_(loaded)
    layer.g_idx_loaded = True


def finish_loading(model: nn.Module) -> None:
    """After the weights load: each act-order layer's packed columns sorted by group, and
    the permutation its input takes at every call (`input_perm`), so that the kernels see
    whole groups in a row as without act-order. A g_idx that is already in order needs
    neither; one whose groups are not all `group` features wide is an error naming it."""
    for name, layer in model.named_modules():
        g_idx = getattr(layer, "g_idx", None)
        if not isinstance(getattr(layer, "quant", None), Int4Linear) or g_idx is None:
            continue
        group, g = layer.quant.group(layer), g_idx.long()
        if torch.equal(g, torch.arange(g.numel(), device=g.device) // group):
            continue
        counts = torch.bincount(g.clamp(min=0), minlength=g.numel() // group)
        if g.min() < 0 or counts.numel() != g.numel() // group or bool((counts != group).any()):
            raise ValueError(f"{name}.g_idx: its groups hold {sorted(set(counts.tolist()))[:4]} "
                             f"input features; act-order groups must each hold {group}")
        perm = torch.argsort(g, stable=True)
        packed = getattr(layer, layer.quant.names[0])
        bits = layer.quant.bits
        packed.data = pack(unpack(packed.data, bits)[:, perm], bits)
        layer.register_buffer("input_perm", perm, persistent=False)


def _place(layer: LinearBase, param: nn.Parameter, full: torch.Tensor, shard) -> None:
    """A checkpoint tensor in loom's layout, for its whole shard ([shard rows, columns]):
    this rank's rows (column-parallel) or columns (row-parallel) go into param."""
    what = f"{type(layer).__name__} {param.dtype} int4 tensor"
    full = full.to(param.dtype)
    cols = param.shape[1]
    if isinstance(layer, RowParallelLinear):
        if full.shape[1] == 1 and cols == 1:  # one scale per output channel: every rank's
            param.data.copy_(shard_of(full, 0, 0, param.shape[0], 1, what))
            return
        param.data.copy_(shard_of(shard_of(full, 1, layer.tp_rank, cols, layer.tp_size, what),
                                  0, 0, param.shape[0], 1, what))
        return
    offset, size, rank, shards = layer.output_rows(shard)
    rows = shard_of(full, 0, rank, size, shards, what)
    param.data.narrow(0, offset, size).copy_(shard_of(rows, 1, 0, cols, 1, what))


def quantize_int4(weight: torch.Tensor, group: int, zero_point: bool, bits: int = 4):
    """A model-dtype weight [out, in] rounded to `bits`-bit integers per group (dummy
    weights): (packed, scale in the weight's dtype, zero points or None)."""
    w = weight.float().reshape(weight.shape[0], -1, group)
    top, mid = (1 << bits) - 1, 1 << (bits - 1)
    if zero_point:
        lo, hi = w.amin(-1, keepdim=True).clamp(max=0), w.amax(-1, keepdim=True).clamp(min=0)
        scale = _as_stored(((hi - lo) / top).clamp(min=1e-8), weight.dtype)
        zero = (-lo / scale).round().clamp(0, top)
    else:
        scale = _as_stored((w.abs().amax(-1, keepdim=True) / (mid - 1)).clamp(min=1e-8),
                           weight.dtype)
        zero = torch.full_like(scale, float(mid))
    q = (w / scale + zero).round().clamp(0, top).to(torch.uint8).reshape(weight.shape)
    return (pack(q, bits), scale.squeeze(-1).to(weight.dtype),
            zero.squeeze(-1).to(torch.uint8) if zero_point else None)


def _quantize_staged(layer: LinearBase, weight: torch.Tensor) -> None:
    """A layer's whole model-dtype weight (dummy weights) rounded to int4 per group."""
    method: Int4Linear = layer.quant
    layer.weight = None
    tensors = quantize_int4(weight, method.group(layer), method.zero_point, method.bits)
    for name, tensor in zip(method.names, tensors):
        if tensor is not None:
            setattr(layer, name, nn.Parameter(tensor, requires_grad=False))


def _as_stored(scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The scale as the layer holds it (the model's dtype), so that the integers are
    rounded against the scale they will be multiplied by."""
    return scale.to(dtype).float()
