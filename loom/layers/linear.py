"""Linear layers that shard themselves over the tensor-parallel group.

Column-parallel layers split the output features, row-parallel ones the input features and
all-reduce the partial sums. Each parameter carries a `weight_loader` that takes the full
checkpoint tensor (or one stacked shard of it) and copies in this rank's slice, so model
files read like single-GPU code. With LoRA on, a layer's `lora` adds its adapters' term
(`loom.lora.layers`) to this rank's output, before any reduction; with fp8 on, a layer's
`quant` computes its matmul (`loom.quantization.fp8`), and a model about to be quantized is
built under `weights_on_meta`, so that no model-dtype copy of its fp8 weights is allocated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from loom.distributed.ops import tp_all_gather, tp_all_reduce
from loom.distributed.parallel_state import get_tp_group


def divide(numerator: int, denominator: int, what: str) -> int:
    if numerator % denominator:
        raise ValueError(f"{what} ({numerator}) is not divisible by the tensor-parallel size "
                         f"({denominator})")
    return numerator // denominator


def shard_of(loaded: torch.Tensor, dim: int, index: int, size: int, shards: int,
             what: str) -> torch.Tensor:
    """Slice `index` of `shards` equal slices along dim, after checking that the checkpoint
    tensor is as wide as the config says (a narrower config would silently load a slice)."""
    if loaded.shape[dim] != size * shards:
        raise ValueError(f"{what}: the checkpoint's tensor is {loaded.shape[dim]} wide along "
                         f"dim {dim}; the model's config makes it {size * shards}")
    return loaded.narrow(dim, index * size, size)


_meta_weights = False


@contextlib.contextmanager
def weights_on_meta() -> Iterator[None]:
    """Column- and row-parallel layers built inside hold their weight on the meta device:
    its shape, dtype and weight_loader, no storage. For a model about to be quantized:
    `loom.quantization.fp8.quantize_model` then gives each layer its real weight (fp8, or
    the model's dtype for a layer the checkpoint leaves unquantized). Biases, replicated
    layers (MoE routers) and everything else are built as always."""
    global _meta_weights
    previous, _meta_weights = _meta_weights, True
    try:
        yield
    finally:
        _meta_weights = previous


def weights_go_on_meta() -> bool:
    """Whether layers built now hold their quantizable weights on the meta device (inside
    `weights_on_meta`): MoE experts follow it too."""
    return _meta_weights


def _param(shape: Sequence[int], loader, meta: bool = False) -> nn.Parameter:
    p = nn.Parameter(torch.empty(*shape, device="meta" if meta else None), requires_grad=False)
    p.weight_loader = loader
    return p


class LinearBase(nn.Module):
    quantizable = False
    """Column- and row-parallel layers: those fp8 quantizes, built under `weights_on_meta`
    with their weight on the meta device."""

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank, tp.world_size
        self.in_features, self.out_features = in_features, out_features
        self.weight = _param((out_features, in_features), self.weight_loader,
                             meta=_meta_weights and self.quantizable)
        self.bias = _param((out_features,), self.weight_loader) if bias else None
        self.lora: nn.Module | None = None
        self.quant = None
        """An fp8 method (`loom.quantization.fp8.Fp8Linear`) when the weight is fp8."""

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        param.data.copy_(loaded)

    def output_rows(self, shard_id=None) -> tuple[int, int, int, int]:
        """Where checkpoint shard `shard_id` lands in this rank's output rows, and which of
        its equal slices this rank holds: (offset, rows, slice index, slices)."""
        return 0, self.out_features, 0, 1

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.quant is None:
            return F.linear(x, self.weight, bias)
        return self.quant.apply(self, x, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.with_lora(x, self.matmul(x, self.bias))

    def with_lora(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return y if self.lora is None else self.lora.add(y, x)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Y = X A with A split by columns: each rank produces out/tp features."""

    quantizable = True

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 gather_output: bool = False) -> None:
        tp_size = get_tp_group().world_size
        super().__init__(in_features, divide(out_features, tp_size, "output features"), bias)
        self.gather_output = gather_output

    def output_rows(self, shard_id=None):
        return 0, self.out_features, self.tp_rank, self.tp_size

    def weight_loader(self, param, loaded, shard_id=None):
        offset, size, rank, shards = self.output_rows(shard_id)
        what = type(self).__name__ + ("" if shard_id is None else f" shard {shard_id}")
        param.data.narrow(0, offset, size).copy_(shard_of(loaded, 0, rank, size, shards, what))

    def forward(self, x):
        y = self.with_lora(x, self.matmul(x, self.bias))
        return tp_all_gather(y) if self.gather_output else y


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of one input stacked into one matmul
    (gate and up); checkpoint shard i lands at its own offset within each rank's slice."""

    def __init__(self, in_features: int, output_sizes: Sequence[int], bias: bool = False) -> None:
        self.output_sizes = list(output_sizes)
        super().__init__(in_features, sum(output_sizes), bias)

    def output_rows(self, shard_id=None):
        if shard_id is None:
            raise ValueError("MergedColumnParallelLinear needs a shard index to load a weight")
        sizes = [s // self.tp_size for s in self.output_sizes]
        return sum(sizes[:shard_id]), sizes[shard_id], self.tp_rank, self.tp_size


class QKVParallelLinear(ColumnParallelLinear):
    """Q, K and V projections in one matmul. With fewer KV heads than ranks, KV heads are
    replicated: each rank keeps the one KV head its query heads use."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 bias: bool = False) -> None:
        tp_size = get_tp_group().world_size
        self.head_dim = head_dim
        self.num_heads = divide(num_heads, tp_size, "attention heads")
        if num_kv_heads >= tp_size:
            self.num_kv_heads, self.kv_replicas = divide(num_kv_heads, tp_size, "KV heads"), 1
        else:
            self.num_kv_heads, self.kv_replicas = 1, divide(tp_size, num_kv_heads, "KV head replicas")
        out = (self.num_heads + 2 * self.num_kv_heads) * head_dim * tp_size
        super().__init__(hidden_size, out, bias)

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def output_rows(self, shard_id=None):
        if shard_id not in ("q", "k", "v"):
            raise ValueError(f"QKVParallelLinear shard must be q, k or v, got {shard_id!r}")
        if shard_id == "q":
            return 0, self.q_size, self.tp_rank, self.tp_size
        offset = self.q_size + (self.kv_size if shard_id == "v" else 0)
        return (offset, self.kv_size, self.tp_rank // self.kv_replicas,
                self.tp_size // self.kv_replicas)


class RowParallelLinear(LinearBase):
    """Y = X A with A split by rows: each rank multiplies its slice of the input features,
    then the partial outputs are summed over ranks."""

    quantizable = True

    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 reduce_results: bool = True) -> None:
        tp_size = get_tp_group().world_size
        super().__init__(divide(in_features, tp_size, "input features"), out_features, bias)
        self.reduce_results = reduce_results

    def weight_loader(self, param, loaded, shard_id=None):
        if param.dim() == 1:  # the bias is added once, after the reduction
            param.data.copy_(loaded)
            return
        size = param.shape[1]
        param.data.copy_(shard_of(loaded, 1, self.tp_rank, size, self.tp_size,
                                  type(self).__name__))

    def forward(self, x):
        y = self.with_lora(x, self.matmul(x))
        if self.reduce_results:
            y = tp_all_reduce(y)
        return y + self.bias if self.bias is not None else y
