"""fp8 MoE experts at load: each FusedMoE's stacked w13 [E, 2I, H] and w2 [E, H, I] are
filled in float8_e4m3fn with float32 scales, as the fused MoE kernels read them (W8A16,
loom/kernels/moe_quant.py), never as a model-dtype copy of the experts.

A model about to be quantized builds its experts on the meta device (`weights_on_meta`);
`prepare_experts` gives each stacked weight a placeholder whose loader takes one expert's
checkpoint tensor at a time:

- from an fp8 checkpoint, an fp8 weight paired with its scale (`loom.quantization.dequant`)
  lands as it is: its values in this rank's rows (gate, up) or columns (down), its scale
  per channel (a per-tensor one spread over the rows) or per block, sliced alike. A
  checkpoint whose experts are in the model's dtype (a recipe that left them unquantized)
  keeps them so: the first tensor decides, and a layer's experts must agree.
- quantized at load (`--quantization fp8`), each arriving tensor's rank slice is quantized
  per output row, amax / 448 (block-wise for a block-wise config with dummy weights), as
  the linear layers' are: no staging, the peak is one expert's tensor.

Dummy weights are drawn into a model-dtype staging tensor of one layer's stacked weight
and quantized expert by expert: one layer's experts in the model's dtype at a time.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from loom.layers.moe import FusedMoE
from loom.quantization import fp8_block
from loom.quantization.config import Fp8Scheme
from loom.quantization.dequant import Fp8Tensor
from loom.quantization.fp8 import FP8, quantize_rows

logger = logging.getLogger(__name__)

_PROJECTIONS = ("gate", "up", "down")


class ExpertWeight:
    """One stacked expert weight of a FusedMoE (w13 or w2) while the checkpoint loads: a
    meta placeholder until the first tensor arrives, then fp8 values and scales (or the
    model's dtype, for a checkpoint that keeps its experts so)."""

    def __init__(self, name: str, layer: FusedMoE, attr: str, quantize: bool,
                 block: tuple[int, int] | None, device: torch.device) -> None:
        self.name, self.layer, self.attr = f"{name}.{attr}", layer, attr
        self.quantize, self.block, self.device = quantize, block, device
        meta = getattr(layer, attr)
        self.shape, self.dtype = tuple(meta.shape), meta.dtype
        self.fp8: bool | None = None
        """Decided by the first tensor: fp8 values and scales, or the model's dtype."""
        self.staging: torch.Tensor | None = None

    def placeholder(self) -> nn.Parameter:
        param = nn.Parameter(torch.empty(self.shape, dtype=self.dtype, device="meta"),
                             requires_grad=False)
        param.weight_loader = self.load
        param.takes_fp8 = True  # load_named_weights hands it fp8 weights with their scales
        if self.quantize:
            param.staged = self  # dummy weights draw through tensor() and wrote()
        return param

    def load(self, param: nn.Parameter, loaded, shard_id) -> None:
        """One expert's checkpoint tensor (or fp8 tensor and scale); shard_id is
        FusedMoE.weight_loader's (expert, 0 gate | 1 up | None down)."""
        if isinstance(loaded, Fp8Tensor):
            if loaded.values.dtype != FP8:
                raise ValueError(f"{loaded.name}: {loaded.values.dtype}; loom's fp8 experts "
                                 "hold float8_e4m3fn")
            self._start(True, shard_id, loaded.values.dtype)
            layer = self.layer
            layer.rows_of(self._values(), shard_id).copy_(layer.rank_part(loaded.values,
                                                                          shard_id))
            self._load_scale(loaded, shard_id)
        elif self.quantize:
            self._start(True, shard_id, loaded.dtype)
            self._store(self.layer.rank_part(loaded, shard_id).to(self.dtype), shard_id)
        else:
            self._start(False, shard_id, loaded.dtype)
            self.layer.weight_loader(self._values(), loaded, shard_id)

    def _values(self) -> nn.Parameter:
        return getattr(self.layer, self.attr)

    def _scale(self) -> nn.Parameter:
        return getattr(self.layer, self.attr + "_scale")

    def _start(self, fp8: bool, shard_id, dtype: torch.dtype) -> None:
        """Give the layer this weight's storage on the first tensor; later ones must agree."""
        if self.fp8 is None:
            self.fp8 = fp8
            self._allocate()
        elif self.fp8 != fp8:
            raise ValueError(f"{self.name}: {_what(shard_id)} arrived as {dtype} where this "
                             f"layer's other experts arrived {'' if self.fp8 else 'not '}in "
                             "fp8; a layer's experts must all be fp8 with scales, or none")

    def _allocate(self) -> None:
        layer, (experts, rows, cols) = self.layer, self.shape
        dtype = FP8 if self.fp8 else self.dtype
        values = nn.Parameter(torch.empty(self.shape, dtype=dtype, device=self.device),
                              requires_grad=False)
        values.weight_loader = layer.weight_loader
        setattr(layer, self.attr, values)
        if not self.fp8:
            return
        shape = ((experts, rows, 1) if self.block is None else
                 (experts, fp8_block.cdiv(rows, self.block[0]),
                  fp8_block.cdiv(cols, self.block[1])))
        setattr(layer, self.attr + "_scale", nn.Parameter(
            torch.empty(shape, dtype=torch.float32, device=self.device), requires_grad=False))
        layer.weight_block = self.block

    def _store(self, part: torch.Tensor, shard_id) -> None:
        """This rank's slice of one expert's tensor in the model's dtype, quantized."""
        layer = self.layer
        if self.block is None:
            q, scale = quantize_rows(part)
            layer.rows_of(self._scale().data, shard_id).copy_(scale)
        else:
            q, scale = fp8_block.quantize_blocks(part, self.block)
            self._scale_rows(shard_id, scale.shape[0]).copy_(scale)
        layer.rows_of(self._values().data, shard_id).copy_(q)

    def _scale_rows(self, shard_id, block_rows: int) -> torch.Tensor:
        """Where an expert's block scales go: its down scales, or its gate or up half, which
        must start at a block boundary of the stacked w13."""
        if shard_id[1] is not None and self.layer.shard % self.block[0]:
            raise ValueError(
                f"{self.name}: this rank's {self.layer.shard} gate (and up) rows are not "
                f"whole {self.block[0]}-row fp8 weight blocks, so gate's and up's scales "
                "cannot stack; use a tensor-parallel size that splits the experts' "
                "intermediate size at block boundaries")
        return self.layer.rows_of(self._scale().data, shard_id, rows=block_rows)

    def _load_scale(self, pair: Fp8Tensor, shard_id) -> None:
        scale = pair.scale.float()
        if scale.numel() == 1:  # per tensor: every row (or block) of this expert's slice
            rows = (self.layer.rows_of(self._scale().data, shard_id) if self.block is None
                    else self._scale_rows(shard_id, self.layer.shard // self.block[0]))
            rows.fill_(scale.item())
        elif self.block is None:
            self._channel_scale(pair, scale, shard_id)
        else:
            self._block_scale(pair, scale, shard_id)

    def _channel_scale(self, pair: Fp8Tensor, scale: torch.Tensor, shard_id) -> None:
        rows = pair.values.shape[0]
        if tuple(scale.shape) not in ((rows,), (rows, 1)):
            raise self._bad_scale(pair, f"a scale per channel ({rows},) or ({rows}, 1), or "
                                  "one per tensor")
        scale = scale.reshape(rows, 1)
        if shard_id[1] is not None:  # gate and up are split by rows; down's rows are whole
            scale = self.layer.rank_part(scale, shard_id)
        self.layer.rows_of(self._scale().data, shard_id).copy_(scale)

    def _block_scale(self, pair: Fp8Tensor, scale: torch.Tensor, shard_id) -> None:
        (rows, cols), (block_n, block_k) = pair.values.shape, self.block
        want = (fp8_block.cdiv(rows, block_n), fp8_block.cdiv(cols, block_k))
        if tuple(scale.shape) != want:
            raise self._bad_scale(pair, f"{block_n}x{block_k} block scales {want}, or one "
                                  "per tensor")
        layer, shard = self.layer, self.layer.shard
        if shard_id[1] is not None:  # this rank's rows of gate or up: whole blocks
            dst = self._scale_rows(shard_id, shard // block_n)
            dst.copy_(scale.narrow(0, layer.tp_rank * dst.shape[0], dst.shape[0]))
            return
        if layer.tp_size > 1 and shard % block_k:
            raise ValueError(
                f"{pair.name}: each of {layer.tp_size} tensor-parallel ranks would hold "
                f"{shard} of its columns, not whole {block_k}-column fp8 weight blocks; use "
                "a tensor-parallel size that splits them at block boundaries")
        part = scale.narrow(1, layer.tp_rank * shard // block_k, fp8_block.cdiv(shard, block_k))
        layer.rows_of(self._scale().data, shard_id).copy_(part)

    def _bad_scale(self, pair: Fp8Tensor, wanted: str) -> ValueError:
        return ValueError(f"{pair.name}: its scale of shape {tuple(pair.scale.shape)} fits "
                          f"no fp8 layout of this model's experts for a "
                          f"{tuple(pair.values.shape)} weight: {wanted}")

    # -- dummy weights (loom.models.loader.dummy) ----------------------------------------------
    def tensor(self) -> torch.Tensor:
        """The whole stacked weight in the model's dtype, to draw into."""
        if self.staging is None:
            self.staging = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        return self.staging

    def wrote(self, offset: int, rows: int) -> None:
        """The staging tensor is drawn: quantize it expert by expert, then free it."""
        staging, self.staging = self.staging, None
        self._start(True, (0, None), staging.dtype)
        for expert in range(self.shape[0]):
            self._store(staging[expert], (expert, None))

    def missing(self) -> str:
        return f"{self.name}: nothing was loaded into it"


def _what(shard_id) -> str:
    expert, which = shard_id
    return f"expert {expert}'s {_PROJECTIONS[2 if which is None else which]} weight"


def prepare_experts(model: nn.Module, scheme: Fp8Scheme, from_checkpoint: bool,
                    device: torch.device) -> int:
    """Give every FusedMoE's w13 and w2 a placeholder that loads them in fp8: as the
    checkpoint has them (from_checkpoint), else quantized at load, unless the scheme's
    ignore list keeps a layer's experts in the model's dtype. Returns how many layers."""
    count = 0
    for name, layer in model.named_modules():
        if not isinstance(layer, FusedMoE):
            continue
        if not from_checkpoint and _ignored(name, scheme):
            for attr in ("w13", "w2"):
                _materialize(layer, attr, device)
            continue
        for attr in ("w13", "w2"):
            setattr(layer, attr, ExpertWeight(name, layer, attr, not from_checkpoint,
                                              scheme.weight_block, device).placeholder())
        count += 1
    return count


def describe(layers: int, from_checkpoint: bool, block: tuple[int, int] | None) -> str:
    """The experts' part of quantize_model's log line."""
    if not layers:
        return ""
    how = ("as the checkpoint holds them (fp8 with their scales, or the model's dtype)"
           if from_checkpoint else "quantized at load, a scale per "
           + ("channel" if block is None else f"{block[0]}x{block[1]} block"))
    plural = "s" if layers > 1 else ""
    return f"; the MoE experts of {layers} layer{plural} {how}, their activations unquantized"


def _ignored(name: str, scheme: Fp8Scheme) -> bool:
    """Whether the ignore list names this layer's experts (the checkpoint's names for
    expert 0's projections): all of them, or none."""
    names = [f"{name}.0.{p}_proj" for p in _PROJECTIONS]
    ignored = [scheme.ignores(n) for n in names]
    if any(ignored) and not all(ignored):
        raise ValueError(f"quantization_config ignore list: {', '.join(names)} share the "
                         "experts' fp8 kernels in loom and must be quantized alike")
    return all(ignored)


def _materialize(layer: FusedMoE, attr: str, device: torch.device) -> None:
    meta = getattr(layer, attr)
    if meta.is_meta:
        param = nn.Parameter(torch.empty(meta.shape, dtype=meta.dtype, device=device),
                             requires_grad=False)
        param.weight_loader = layer.weight_loader
        setattr(layer, attr, param)
