"""Block-wise fp8 (Qwen3's and DeepSeek's FP8 releases, llm-compressor's FP8_BLOCK): a
weight scale per block of `rows x cols` (scales (ceil(out / rows), ceil(in / cols))), and
activations quantized per token per group of `cols` input features as they arrive, so that
each block's partial sum carries one activation scale and one weight scale:

    y[t, n] = sum over k-blocks b of (xq[t, b] . wq[n, b]) * x_scale[t, b] * w_scale[n // rows, b]

Here: the torch reference (the CPU path, float32 over the same fp8 values), the weights'
quantization for a model drawn in its dtype, and the scales' loading at tensor
parallelism, where a rank's rows and columns must be whole blocks. CUDA runs the Triton
GEMM in `loom.kernels.fp8_block_gemm`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loom.layers.linear import LinearBase, RowParallelLinear

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max
_EPS = torch.finfo(torch.float32).eps


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _blocks(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """x (R, C) in float32, zero-padded to whole blocks, as (R/rows, rows, C/cols, cols)."""
    r, c = x.shape
    padded = F.pad(x.float(), (0, cdiv(c, cols) * cols - c, 0, cdiv(r, rows) * rows - r))
    return padded.view(cdiv(r, rows), rows, cdiv(c, cols), cols)


def _quantize(x: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 values of x and a float32 scale per block: amax / 448 (padding counts as 0)."""
    blocks = _blocks(x, rows, cols)
    scale = (blocks.abs().amax(dim=(1, 3), keepdim=True) / FP8_MAX).clamp(min=_EPS)
    q = (blocks / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    r, c = x.shape
    return q.view(q.shape[0] * rows, -1)[:r, :c].contiguous(), scale[:, 0, :, 0].contiguous()


def quantize_groups(x: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x (tokens, K) -> fp8 values and float32 scales (tokens, ceil(K / group)): one per
    token per group of features (the last group may be narrower)."""
    return _quantize(x, 1, group)


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight (out, in) -> fp8 values and float32 scales (ceil(out / rows), ceil(in / cols))."""
    return _quantize(w, *block)


def dequantize(q: torch.Tensor, scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """float32 q * its block's scale."""
    r, c = q.shape
    full = scale.repeat_interleave(rows, 0)[:r].repeat_interleave(cols, 1)[:, :c]
    return q.float() * full


def block_matmul(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 block: tuple[int, int]) -> torch.Tensor:
    """The float32 reference: x (tokens, K) quantized per token group, times the block-scaled
    fp8 weight (N, K), both dequantized exactly (fp8 times a float32 scale) before one float32
    matmul, as compressed-tensors' fake quantization computes it."""
    xq, x_scale = quantize_groups(x, block[1])
    return dequantize(xq, x_scale, 1, block[1]) @ dequantize(weight, weight_scale, *block).t()


def check_row_parallel(name: str, layer: LinearBase, block: tuple[int, int]) -> None:
    """A row-parallel rank's input columns must be whole blocks: its scales are then columns
    of the checkpoint's, and each activation group lies within one rank."""
    cols = block[1]
    if layer.tp_size > 1 and layer.in_features % cols:
        raise ValueError(f"{name}: each of {layer.tp_size} tensor-parallel ranks would hold "
                         f"{layer.in_features} input features, not a whole number of the "
                         f"checkpoint's {cols}-column weight blocks; use a tensor-parallel "
                         "size that splits them at block boundaries")


def load_block_scale(name: str, layer: LinearBase, block: tuple[int, int],
                     param: torch.Tensor, loaded: torch.Tensor, shard_id=None) -> None:
    """Copy this rank's block scales of checkpoint shard `shard_id`: its rows of blocks land
    where its weight rows do (`output_rows`), a row-parallel rank takes its columns."""
    rows, cols = block
    offset, size, rank, shards = layer.output_rows(shard_id)
    what = name + ("" if shard_id is None else f" shard {shard_id!r}")
    _check_rows(what, offset, size, shards, layer.out_features, rows)
    in_full = layer.in_features * (layer.tp_size if isinstance(layer, RowParallelLinear) else 1)
    want = (cdiv(size * shards, rows), cdiv(in_full, cols))
    if tuple(loaded.shape) != want:
        raise ValueError(f"{what}: the checkpoint's block scale is {tuple(loaded.shape)}; its "
                         f"weight's shape and {rows}x{cols} blocks make {want}")
    loaded = loaded.narrow(0, rank * size // rows, cdiv(size, rows))
    if isinstance(layer, RowParallelLinear):
        loaded = loaded.narrow(1, layer.tp_rank * param.shape[1], param.shape[1])
    param.data.narrow(0, offset // rows, loaded.shape[0]).copy_(loaded)


def _check_rows(what: str, offset: int, size: int, shards: int, out_features: int,
                rows: int) -> None:
    """A shard's rows must start a block in this rank's output, and be whole blocks unless
    they are the last rows of an unsplit layer (a ragged last block, as ceil scales allow)."""
    ragged_end = shards == 1 and offset + size == out_features
    if offset % rows or (size % rows and not ragged_end):
        raise ValueError(
            f"{what}: its {size} output rows at row {offset} of this rank's "
            f"{out_features} ({shards} slice(s) of the checkpoint tensor) are not whole "
            f"{rows}-row weight blocks; block-wise fp8 needs each tensor-parallel rank's "
            "q/k/v (or gate/up) rows to start and end at block boundaries: use a smaller "
            "tensor-parallel size")
