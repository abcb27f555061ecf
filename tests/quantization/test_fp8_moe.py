"""fp8 MoE experts in loom's FusedMoE: `--quantization fp8` keeps a MoE model's experts in
fp8 (half their bytes) without ever building a model-dtype copy of them, and the CPU path
runs fp8 experts by dequantizing the ones a batch uses, eager and under torch.compile.
(Checkpoints with fp8 experts: test_fp8_experts.py; the kernels: tests/kernels.)"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from loom.layers.moe import FusedMoE, route
from tests.quantization.test_fp8_loading import _load

FP8 = torch.float8_e4m3fn


def _experts(model) -> list[FusedMoE]:
    return [m for m in model.modules() if isinstance(m, FusedMoE)]


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe"])
def test_quantized_experts_take_half_the_bytes(kind, tiny_model_factory):
    """bfloat16 experts -> fp8 values (exactly half) and a float32 scale per row."""
    path, _ = tiny_model_factory(kind)
    plain = _experts(_load(path, dtype="bfloat16"))
    fp8 = _experts(_load(path, dtype="bfloat16", quantization="fp8"))
    assert plain and len(fp8) == len(plain)
    for before, after in zip(plain, fp8):
        assert after.w13.dtype == after.w2.dtype == FP8
        assert after.w13_scale.shape == (*after.w13.shape[:2], 1)
        assert after.w2_scale.shape == (*after.w2.shape[:2], 1)
        values = before.w13.nbytes + before.w2.nbytes
        assert after.w13.nbytes + after.w2.nbytes == values // 2
        experts, rows13, hidden = before.w13.shape
        assert after.w13_scale.nbytes + after.w2_scale.nbytes == 4 * experts * (rows13 + hidden)


class _StackedAllocations(TorchDispatchMode):
    """Counts allocations of tensors in `dtype` shaped like a layer's stacked experts."""

    def __init__(self, dtype: torch.dtype, shapes: set[tuple[int, ...]]) -> None:
        super().__init__()
        self.dtype, self.shapes, self.count = dtype, shapes, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aten = torch.ops.aten
        if func in (aten.empty.memory_format, aten.empty_strided.default) and \
                out.dtype == self.dtype and tuple(out.shape) in self.shapes and not out.is_meta:
            self.count += 1
        return out


@pytest.mark.parametrize("load_format, stacked", [("safetensors", 0), ("dummy", 2)])
def test_no_model_dtype_copy_of_the_experts(load_format, stacked, tiny_model_factory):
    """From a checkpoint each expert's tensor is quantized as it arrives: no stacked
    bfloat16 experts are ever allocated. Dummy weights are drawn into one stacked tensor
    per weight (w13, w2) of the one MoE layer, each quantized and freed at once."""
    path, _ = tiny_model_factory("qwen3_moe")
    plain = _experts(_load(path, dtype="bfloat16"))
    shapes = {tuple(p.shape) for m in plain for p in (m.w13, m.w2)}
    with _StackedAllocations(torch.bfloat16, shapes) as seen:
        model = _load(path, dtype="bfloat16", quantization="fp8", load_format=load_format)
    assert all(m.w13.dtype == FP8 for m in _experts(model))
    assert seen.count == stacked * len(plain)


def _fp8_layer(block, experts=4, hidden=64, inter=32):
    """A FusedMoE with fp8 experts set by hand (values and scales drawn here), and each
    expert's weights dequantized in float64."""
    layer = FusedMoE(experts, 2, hidden, inter, renormalize=True)
    exact = {}
    for attr in ("w13", "w2"):
        shape = getattr(layer, attr).shape
        q = (torch.randn(shape) * 100).clamp(-448, 448).to(FP8)
        if block is None:
            scale = torch.rand(shape[0], shape[1], 1) / 100
            full = scale.double()
        else:
            scale = torch.rand(shape[0], -(-shape[1] // block[0]), -(-shape[2] // block[1]))
            scale /= 100
            full = scale.double().repeat_interleave(block[0], 1)[:, :shape[1]]
            full = full.repeat_interleave(block[1], 2)[:, :, :shape[2]]
        setattr(layer, attr, torch.nn.Parameter(q, requires_grad=False))
        setattr(layer, attr + "_scale", torch.nn.Parameter(scale, requires_grad=False))
        exact[attr] = q.double() * full
    layer.weight_block = block
    return layer, exact


def _expected(x, logits, exact):
    """sum_k w_k * down(silu(gate) * up) per token, in float64, token by token."""
    weights, ids = route(logits, 2, True)
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(2):
            e = int(ids[t, k])
            gate, up = (exact["w13"][e] @ x[t].double()).chunk(2)
            out[t] += weights[t, k].double() * (exact["w2"][e] @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize("block", [None, (32, 32), (16, 48)], ids=["channel", "32x32", "16x48"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cpu_path_runs_fp8_experts(block, compiled):
    """The CPU reference dequantizes each expert it uses (in float32, the model's dtype
    here): float32 matmuls over 64 products, ~1e-6 from the float64 sum."""
    torch.manual_seed(0)
    layer, exact = _fp8_layer(block)
    x, logits = torch.randn(5, 64), torch.randn(5, 4)
    forward = torch.compile(layer, backend="eager", fullgraph=True) if compiled else layer
    got = forward(x, logits)
    torch.testing.assert_close(got.double(), _expected(x, logits, exact), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("block", [None, (16, 32)], ids=["channel", "16x32"])
def test_a_per_tensor_expert_scale_fills_its_rows(block):
    """vLLM's `fp8` method without blocks (Mixtral-8x7B-FP8's experts) scales each expert
    tensor by one number: it fills the scales of the rows (or blocks) the tensor loads."""
    from loom.layers.linear import weights_on_meta
    from loom.quantization.config import Fp8Scheme
    from loom.quantization.dequant import Fp8Tensor
    from loom.quantization.fp8_moe import prepare_experts
    with weights_on_meta():
        holder = torch.nn.Module()
        holder.experts = FusedMoE(2, 1, 64, 32, renormalize=True)
    assert holder.experts.w13.is_meta
    scheme = (Fp8Scheme("fp8", True, "token") if block is None
              else Fp8Scheme("fp8", True, "group", weight_block=block))
    assert prepare_experts(holder, scheme, True, torch.device("cpu")) == 1
    layer, shapes = holder.experts, {0: (32, 64), 1: (32, 64), None: (64, 32)}
    placeholders = {"w13": layer.w13, "w2": layer.w2}  # as load_named_weights holds them
    for e in range(2):
        for which, shape in shapes.items():
            q = torch.randn(shape).to(FP8)
            scale = torch.tensor(0.5 + e + (which or 0) / 4)
            param = placeholders["w13" if which is not None else "w2"]
            param.weight_loader(param, Fp8Tensor(f"e{e}", q, scale), (e, which))
    assert layer.w13.dtype == layer.w2.dtype == FP8 and layer.weight_block == block
    gate_up = torch.tensor([[0.5, 0.75], [1.5, 1.75]])  # (expert, gate | up)
    rows = 32 if block is None else 32 // block[0]
    want13 = gate_up.repeat_interleave(rows, 1)
    assert torch.equal(layer.w13_scale.reshape(2, 2 * rows, -1)[:, :, 0], want13)
    assert torch.equal(layer.w2_scale.flatten(1), torch.tensor([[0.5], [1.5]]).expand(
        2, layer.w2_scale[0].numel()))
