"""Quantizing linear layers at load without a model-dtype copy of the model.

A model about to be quantized is built with its column- and row-parallel weights on the
meta device (`loom.layers.linear.weights_on_meta`). A layer quantized at load (fp8 on an
unquantized checkpoint, or dummy weights) keeps a meta placeholder whose `weight_loader`
writes each arriving tensor, through the layer's own loader (tensor-parallel slices,
stacked q/k/v or gate/up shards, replicated KV heads), into a staging tensor of the layer's
shape in the model's dtype. Once every output row has arrived, the layer's quantizer makes
its real weights from the staging tensor, which is freed. The peak is then the quantized
model plus the layers whose tensors are still arriving: one, in a checkpoint that keeps a
layer's tensors together.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from loom.layers.linear import LinearBase

Quantizer = Callable[[LinearBase, torch.Tensor], None]
"""Makes a layer's real weights (weight, weight_scale) from its whole model-dtype weight."""


class StagedWeight:
    """One layer's weight while its rows arrive in the model's dtype."""

    def __init__(self, name: str, layer: LinearBase, device: torch.device,
                 quantize: Quantizer, meta: nn.Parameter | None = None) -> None:
        """meta: the placeholder whose shape and dtype the staging tensor takes (default
        the layer's weight; an MoE layer's stacked experts, whose rows are experts)."""
        self.name, self.layer, self.device, self.quantize = name, layer, device, quantize
        meta = layer.weight if meta is None else meta
        self.shape, self.dtype = tuple(meta.shape), meta.dtype
        self.staging: torch.Tensor | None = None
        self.written = torch.zeros(self.shape[0], dtype=torch.bool)
        """Which of the layer's output rows the staging tensor holds."""

    def placeholder(self) -> nn.Parameter:
        """The layer's weight until it is whole: no storage, the model's dtype, a
        weight_loader that stages what it is given."""
        param = nn.Parameter(torch.empty(self.shape, dtype=self.dtype, device="meta"),
                             requires_grad=False)
        param.weight_loader = self.load
        param.staged = self
        return param

    def tensor(self) -> torch.Tensor:
        """The staging tensor (allocated on first use)."""
        if self.staging is None:
            self.staging = torch.empty(self.shape, dtype=self.dtype, device=self.device)
        return self.staging

    def load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        self.layer.weight_loader(self.tensor(), loaded, shard_id)
        offset, rows, _, _ = self.layer.output_rows(shard_id)
        self.wrote(offset, rows)

    def wrote(self, offset: int, rows: int) -> None:
        """Rows [offset, offset + rows) of the staging tensor are filled; quantize it once
        they all are."""
        self.written[offset:offset + rows] = True
        if bool(self.written.all()):
            staging, self.staging = self.staging, None
            self.written.zero_()
            self.quantize(self.layer, staging)

    def missing(self) -> str:
        """Why the layer is not whole, for the error after loading."""
        have = int(self.written.sum())
        if not have:
            return f"{self.name}.weight: nothing was loaded into it"
        gaps = _runs((~self.written).tolist())
        shown = ", ".join(f"{a}-{b - 1}" for a, b in gaps[:4]) + (" ..." if len(gaps) > 4 else "")
        return (f"{self.name}.weight: the checkpoint filled {have} of this rank's "
                f"{self.shape[0]} output rows (rows {shown} missing), so the layer cannot be "
                "quantized; is one of its stacked tensors (q/k/v, gate/up) missing?")


def stage(name: str, layer: LinearBase, device: torch.device, quantize: Quantizer) -> None:
    """Make `layer` quantize its weight as it arrives; any weight it held is dropped."""
    layer.weight = StagedWeight(name, layer, device, quantize).placeholder()


def materialize(layer: LinearBase, device: torch.device) -> None:
    """Give a layer built under `weights_on_meta` that stays in the model's dtype its real
    weight, loaded as always."""
    meta = layer.weight
    if not meta.is_meta:
        return
    weight = nn.Parameter(torch.empty(meta.shape, dtype=meta.dtype, device=device),
                          requires_grad=False)
    weight.weight_loader = meta.weight_loader
    layer.weight = weight


def check_materialized(model: nn.Module) -> None:
    """After loading: a ValueError naming the first parameter still without storage (a
    layer quantized at load whose rows did not all arrive, or anything left on meta)."""
    for name, param in model.named_parameters():
        if not param.is_meta:
            continue
        staged = getattr(param, "staged", None)
        if staged is not None:
            raise ValueError(f"quantization at load: {staged.missing()}")
        raise ValueError(f"{name}: still on the meta device after loading (no storage)")


def _runs(flags: list[bool]) -> list[tuple[int, int]]:
    """[start, end) of each run of True in flags."""
    runs, start = [], None
    for i, flag in enumerate(flags + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append((start, i))
            start = None
    return runs
