"""fp8 linear layers (W8A8): float8_e4m3fn weights with a scale per output channel, and
activations quantized as they arrive (per token, or by the checkpoint's static scale);
or, for block-wise checkpoints, a scale per weight block and activations per token per
group (`fp8_block`).

On CUDA, `loom::fp8_linear` (`loom.kernels.fp8_linear`): at decode row counts loom's GEMV
on the fp8 weight, the rows unquantized (at one row cuBLASLt's fp8 GEMMs read the weight at
~37% of the memory rate, run_zzz91); otherwise a Triton per-token quantization and
`torch._scaled_mm` with row-wise scales (1.6-1.8x bf16's rate at 8192 rows). Block-wise,
`loom::fp8_block_linear` (`loom.kernels.fp8_block_gemm`): cuBLASLt's block-scaled GEMM
where it applies, else loom's Triton GEMM. On the CPU the same quantized values are
multiplied in float32: the correctness reference, checked against compressed-tensors' own
fake quantization.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator

import torch
from torch import nn

from loom.layers.linear import ColumnParallelLinear, LinearBase, RowParallelLinear, shard_of
from loom.models.weights import checkpoint_modules
from loom.quantization import fp8_block
from loom.quantization.config import Fp8Scheme
from loom.quantization.staging import materialize, stage

logger = logging.getLogger(__name__)

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
INT8 = torch.int8
INT8_RANGE = 127.5
"""A symmetric int8 scale is amax / 127.5 (half of 127 - (-128)), as compressed-tensors
computes it; values are rounded to even after clamping to [-128, 127]."""
DTYPES = {"fp8": FP8, "int8": INT8}
_EPS = torch.finfo(torch.float32).eps


def quantize_rows(x: torch.Tensor, dtype: torch.dtype = FP8) -> tuple[torch.Tensor, torch.Tensor]:
    """x (rows, cols) -> fp8 (or int8) values and a float32 scale (rows, 1) per row:
    amax / 448 (int8: amax / 127.5)."""
    top = FP8_MAX if dtype == FP8 else INT8_RANGE
    scale = (x.abs().amax(dim=-1, keepdim=True).float() / top).clamp(min=_EPS)
    return _quantize(x, scale, dtype), scale


def _quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if dtype == INT8:
        return (x.float() / scale).clamp(-128, 127).round().to(INT8)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


class Fp8Linear:
    """The matmul of one fp8 (or int8 W8A8) layer: quantize the input, multiply, rescale."""

    def __init__(self, activations: str, block: tuple[int, int] | None = None,
                 block_kernel: bool = True, dtype: torch.dtype = FP8) -> None:
        self.activations = activations
        self.dtype = dtype
        """The weights' and quantized activations' dtype: fp8, or int8 (per channel)."""
        self.block = block
        """(rows, cols) of a weight scale block; None: a scale per output channel."""
        self.block_kernel = block_kernel
        """Block-wise on CUDA: the Triton GEMM (False: the float32 reference, logged)."""

    def quantize_input(self, layer: LinearBase, x: torch.Tensor):
        if self.activations == "token":
            return quantize_rows(x, self.dtype)
        scale = layer.input_scale.reshape(1, 1).expand(x.shape[0], 1)
        return _quantize(x, scale, self.dtype), scale

    def apply(self, layer: LinearBase, x: torch.Tensor,
              bias: torch.Tensor | None) -> torch.Tensor:
        # 2-D inputs (every model's) go in as they are, so that the decode GEMV pass sees
        # the op's input as the norm or SiLU·mul that made it
        x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
        if self.block is not None:
            y = self._block_matmul(layer, x2)
        elif self.use_op(x):
            y = torch.ops.loom.fp8_linear(x2, layer.weight, layer.weight_scale,
                                          layer.input_scale if self.activations == "static"
                                          else None)
        else:
            xq, x_scale = self.quantize_input(layer, x2)
            y = (xq.float() @ layer.weight.float().t()) * x_scale * layer.weight_scale.t()
        if y.dtype != x.dtype:
            y = y.to(x.dtype)
        if x.dim() != 2:
            y = y.reshape(*x.shape[:-1], -1)
        return y if bias is None else y + bias

    @staticmethod
    def use_op(x: torch.Tensor) -> bool:
        """Per-channel layers take `loom::fp8_linear` on CUDA; the float32 reference on the
        CPU."""
        return x.is_cuda

    def _block_matmul(self, layer: LinearBase, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda and self.block_kernel:
            return torch.ops.loom.fp8_block_linear(x, layer.weight, layer.weight_scale,
                                                   *self.block)
        return fp8_block.block_matmul(x, layer.weight, layer.weight_scale, self.block)


def quantize_model(model: nn.Module, scheme: Fp8Scheme, from_checkpoint: bool,
                   device: torch.device | None = None) -> list[LinearBase]:
    """Make the model's column- and row-parallel layers fp8, before its weights load.
    from_checkpoint: the weights arrive in fp8 with their scales; else they arrive in the
    model's dtype and each layer is quantized as soon as all its rows have
    (`loom.quantization.staging`), so no model-dtype copy of the model is ever whole. A
    layer built with its weight on the meta device (`weights_on_meta`) that the checkpoint
    leaves unquantized gets a real one on `device` (default: the model's). Replicated layers
    (MoE routers) stay in the model's dtype; MoE experts load in fp8 for the fused MoE's
    W8A16 kernels (`loom.quantization.fp8_moe`). Returns the fp8 linear layers."""
    device = device or _device(model)
    if device.type == "cuda" and scheme.weight_block is None:
        importlib.import_module("loom.kernels.fp8_linear")  # registers loom::fp8_linear
    method = Fp8Linear(scheme.activations, scheme.weight_block,
                       _block_kernel(device, scheme), DTYPES[scheme.dtype])
    model.fp8_weight_block = scheme.weight_block  # for fp8 experts' scales (models.weights)
    layers, kept = [], []
    for name, layer in quantizable_layers(model, scheme, device, kept):
        layer.quant = method
        layers.append(layer)
        if from_checkpoint:
            _fp8_parameters(name, layer, scheme, device)
        else:
            stage(name, layer, device, _quantize_staged)
    from loom.quantization import fp8_moe
    if scheme.dtype == "int8":
        moe = _int8_experts(model, scheme, from_checkpoint, device)
        experts = f"; the MoE experts of {moe} layers int8 (W8A16)" if moe else ""
    else:
        moe = fp8_moe.prepare_experts(model, scheme, from_checkpoint, device)
        experts = fp8_moe.describe(moe, from_checkpoint, scheme.weight_block)
    logger.info("quantization (%s): %s in %d linear layers; %d kept in the model's dtype as "
                "the checkpoint asks%s", scheme.method, scheme.describe(), len(layers),
                len(kept), experts)
    return layers


def _int8_experts(model: nn.Module, scheme: Fp8Scheme, from_checkpoint: bool,
                  device: torch.device) -> int:
    """A W8A8-INT8 checkpoint's MoE experts: int8 per channel, run as 8-bit weight-only
    experts (`loom.quantization.int4_moe`, the fused MoE's 8-bit kernels), the tokens
    unquantized as fp8 experts run them. The number of MoE layers."""
    from loom.quantization import int4_moe
    from loom.quantization.int4_config import Int4Scheme
    from loom.quantization.int4 import _raw
    experts = Int4Scheme("int8", None, False, scheme.ignore, bits=8)
    count = int4_moe.prepare_experts(model, experts, from_checkpoint, device,
                                     keep_ignored=True)
    model.int4_experts = count > 0  # models.weights names their tensors for them
    if count and from_checkpoint and scheme.activations == "static":
        for layer in model.modules():  # the experts' input scales: unused, dropped
            if isinstance(layer, int4_moe.FusedMoE):
                for attr in ("w13_input_scale", "w2_input_scale"):
                    setattr(layer, attr, _raw(torch.empty(0, device=device),
                                              lambda p, t, shard=None: None))
    return count


def quantizable_layers(model: nn.Module, scheme, device: torch.device,
                       kept: list[str]) -> Iterator[tuple[str, LinearBase]]:
    """The model's column- and row-parallel layers that the scheme (fp8 or int4)
    quantizes; those its ignore list keeps in the model's dtype get their real weight
    (they were built on meta) and their names go to `kept`."""
    for name, layer in model.named_modules():
        if not isinstance(layer, (ColumnParallelLinear, RowParallelLinear)):
            continue
        if _ignored(name, scheme):
            kept.append(name)
            materialize(layer, device)
            continue
        yield name, layer


def _quantize_staged(layer: LinearBase, weight: torch.Tensor) -> None:
    """A layer's weight, whole in the model's dtype, as fp8: one scale per output channel,
    or per block for a block-wise scheme (dummy weights for a block-wise checkpoint)."""
    block = layer.quant.block
    q, scale = (quantize_rows(weight, layer.quant.dtype) if block is None
                else fp8_block.quantize_blocks(weight, block))
    layer.weight = nn.Parameter(q, requires_grad=False)
    layer.weight_scale = nn.Parameter(scale, requires_grad=False)


def _device(model: nn.Module) -> torch.device:
    """Where the model's parameters with storage are."""
    param = next((p for p in model.parameters() if not p.is_meta), None)
    return param.device if param is not None else torch.device("cpu")


def _ignored(name: str, scheme: Fp8Scheme) -> bool:
    if scheme.ignores(name):  # the checkpoint's module is loom's (Phi-3's fused qkv_proj)
        return True
    names = checkpoint_modules(name)
    ignored = [scheme.ignores(n) for n in names]
    if any(ignored) and not all(ignored):
        raise ValueError(f"quantization_config ignore list: {', '.join(names)} share one "
                         "matmul in loom and must be quantized alike")
    return all(ignored)


def _block_kernel(device: torch.device, scheme: Fp8Scheme) -> bool:
    """Whether block-wise layers take the Triton GEMM on CUDA (importing it registers its op
    before any graph is traced)."""
    if scheme.weight_block is None or device.type != "cuda":
        return True
    from loom.kernels.fp8_block_gemm import MIN_BLOCK_K, kernel_applies
    if kernel_applies(scheme.weight_block):
        return True
    logger.warning("block-wise fp8: the checkpoint's %d-column blocks are not a power-of-two "
                   "multiple of %d, which the Triton fp8 GEMM needs; the layers dequantize "
                   "and multiply in float32 (slow)", scheme.weight_block[1], MIN_BLOCK_K)
    return False


def _fp8_parameters(name: str, layer: LinearBase, scheme: Fp8Scheme,
                    device: torch.device) -> None:
    weight = nn.Parameter(torch.empty(layer.weight.shape, dtype=DTYPES[scheme.dtype],
                                      device=device), requires_grad=False)
    weight.weight_loader = layer.weight_loader
    layer.weight = weight
    if scheme.weight_block is not None:
        _block_scale(name, layer, scheme.weight_block)
        return
    layer.weight_scale = nn.Parameter(
        torch.empty(layer.out_features, 1, dtype=torch.float32, device=device),
        requires_grad=False)
    layer.weight_scale.weight_loader = lambda p, t, shard=None: _load_scale(layer, p, t, shard)
    if scheme.activations == "static":
        layer.input_scale = nn.Parameter(torch.zeros(1, dtype=torch.float32, device=device),
                                         requires_grad=False)
        # Stacked projections share one input: the largest of their scales covers it.
        layer.input_scale.weight_loader = lambda p, t, shard=None: p.data.copy_(
            torch.maximum(p.data, t.reshape(1).to(p.device)))


def _load_scale(layer: LinearBase, param: nn.Parameter, loaded: torch.Tensor, shard_id) -> None:
    """A per-channel scale loads as its weight's rows do; a per-tensor one fills them."""
    offset, size, rank, shards = layer.output_rows(shard_id)
    rows = param.data.narrow(0, offset, size)
    if loaded.numel() == 1:
        rows.fill_(loaded.item())
    else:
        rows.copy_(shard_of(loaded.reshape(-1, 1), 0, rank, size, shards,
                            f"{type(layer).__name__} weight_scale"))


def _block_scale(name: str, layer: LinearBase, block: tuple[int, int]) -> None:
    if isinstance(layer, RowParallelLinear):
        fp8_block.check_row_parallel(name, layer, block)
    shape = (fp8_block.cdiv(layer.out_features, block[0]),
             fp8_block.cdiv(layer.in_features, block[1]))
    layer.weight_scale = nn.Parameter(
        torch.empty(shape, dtype=torch.float32, device=layer.weight.device), requires_grad=False)
    layer.weight_scale.weight_loader = lambda p, t, shard=None: fp8_block.load_block_scale(
        name, layer, block, p, t, shard)
