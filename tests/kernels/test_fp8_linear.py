"""The per-channel fp8 op (loom.kernels.fp8_linear) against loom's CPU reference
(loom.quantization.fp8, itself checked against compressed-tensors): the Triton per-token
quantization to the reference's very bytes, the op's two paths (the GEMV at decode rows,
W8A16; the scaled GEMM, W8A8) and which rows take which.

On the CPU the kernels run in Triton's interpreter and torch._scaled_mm is torch's CPU
kernel; with CUDA the same checks run on the GPU. Outputs are poisoned before each call
where the kernel writes into a tensor it was given, and every check draws fresh inputs.
"""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels import fp8_linear as mod  # noqa: E402
from loom.kernels.gemv import GemvConfig  # noqa: E402
from loom.kernels.interpreter import interpreted, patch_interpreter  # noqa: E402
from loom.quantization import fp8 as ref  # noqa: E402

INTERPRET = interpreted(mod._quantize_rows_kernel)
DEVICE = "cpu" if INTERPRET else "cuda"
if INTERPRET:
    patch_interpreter()  # fp8 conversion rounded as the GPU's
_seed = iter(range(1000))


def _x(m, k, dtype=torch.float32):
    gen = torch.Generator().manual_seed(next(_seed))
    x = torch.randn(m, k, generator=gen) * 3
    x[0, 1] = 40.0  # one row with a far larger range than the others
    return x.to(dtype)


def _weight(n, k):
    gen = torch.Generator().manual_seed(next(_seed))
    return ref.quantize_rows(torch.randn(n, k, generator=gen) / k ** 0.5)


@pytest.mark.parametrize("m, k", [(1, 64), (3, 80), (5, 200)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_quantize_to_the_references_bytes(m, k, dtype):
    """Per token: amax / 448 and x / scale, the bytes and scales the CPU reference makes
    (K not a power of two: the masked tail of the row's tile)."""
    for _ in range(2):
        x = _x(m, k, dtype)
        q, scale = mod.quantize_rows(x.to(DEVICE))
        want_q, want_scale = ref.quantize_rows(x)
        assert q.shape == (m, k) and scale.shape == (m, 1)
        assert torch.equal(scale.cpu(), want_scale)
        assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_rows_quantize_as_the_activation_would(dtype):
    """[gate | up] rows: silu(gate) * up as torch's eager ops round it, then quantized per
    token: the very bytes of the reference quantizing torch's activation; and through the
    scaled GEMM, the reference's product."""
    import torch.nn.functional as F
    x = _x(3, 160, dtype)
    act = F.silu(x[:, :80]) * x[:, 80:]
    q, scale = mod.quantize_rows(x.to(DEVICE), silu_mul_input=True)
    want_q, want_scale = ref.quantize_rows(act)
    assert q.shape == (3, 80)
    torch.testing.assert_close(scale.cpu(), want_scale, rtol=0 if dtype == torch.float32
                               else 1e-2, atol=0)
    if dtype == torch.float32:
        assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    else:  # the interpreter truncates to bf16 where torch rounds: within fp8's own step
        error = (q.cpu().float() * scale.cpu() - act.float()).abs()
        assert (error <= 0.07 * act.float().abs() + scale.cpu() * 2 ** -8).all()
    wq, ws = _weight(24, 80)
    y = mod.scaled_mm_linear(x.to(DEVICE), wq.to(DEVICE), ws.to(DEVICE), silu_mul_input=True)
    layer = torch.nn.Module()
    layer.weight, layer.weight_scale = wq, ws
    want = ref.Fp8Linear("token").apply(layer, act, None)
    torch.testing.assert_close(y.cpu().float(), want.float(), rtol=2e-2,
                               atol=2e-2 * want.float().abs().max().item())


def test_static_scale_quantizes_every_row_by_it():
    """A checkpoint's static input scale: every row divided by it, clamped to +-448 (the
    large value saturates), the scale repeated per row for the row-wise GEMM."""
    x = _x(4, 96)
    static = torch.tensor([0.05])
    q, scale = mod.quantize_rows(x.to(DEVICE), static.to(DEVICE))
    assert torch.equal(scale.cpu(), torch.full((4, 1), 0.05))
    want = ref._quantize(x, static.reshape(1, 1), ref.FP8)
    assert torch.equal(q.cpu().view(torch.uint8), want.view(torch.uint8))
    assert q.cpu()[0, 1].float() == 448


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_add_rms_norm_rows_quantize_as_the_norm_then_the_reference(dtype, static):
    """x + residual and RMSNorm(x + residual) * weight, then quantized, in one kernel: the
    sum is the reference add's very values; the rows are the reference quantizing
    loom's norm (the layers' reference), and the scaled GEMM after it gives the
    reference's product."""
    from loom.layers.norm import fused_add_rms_norm
    x, residual = _x(5, 96, dtype), _x(5, 96, dtype)
    norm_weight = (1 + 0.1 * _x(1, 96)[0]).to(dtype)
    in_scale = torch.tensor([0.03]) if static else None
    normed, want_sum = fused_add_rms_norm(x, residual, norm_weight, 1e-5)
    q, scale, out_sum = mod.add_rms_norm_quantize_rows(
        x.to(DEVICE), residual.to(DEVICE), norm_weight.to(DEVICE), 1e-5,
        None if in_scale is None else in_scale.to(DEVICE))
    _same_sum(out_sum.cpu(), want_sum)
    if static:
        want_q = ref._quantize(normed, in_scale.reshape(1, 1), ref.FP8)
        want_scale = in_scale.expand(5, 1)
    else:
        want_q, want_scale = ref.quantize_rows(normed)
    # The norm's sum of squares in another order (and, in bf16 on the interpreter, values
    # truncated where torch rounds) may move a value across an fp8 rounding boundary:
    # within one fp8 step of the reference's (saturated alike with a static scale).
    torch.testing.assert_close(scale.cpu(), want_scale.float(), rtol=1e-2, atol=0)
    assert ((q.cpu().float() - want_q.float()).abs()
            <= 0.13 * want_q.float().abs() + 2 ** -9).all()
    wq, ws = _weight(24, 96)
    y, y_sum = mod.add_rms_norm_scaled_mm_linear(
        x.to(DEVICE), residual.to(DEVICE), norm_weight.to(DEVICE), 1e-5, wq.to(DEVICE),
        ws.to(DEVICE), None if in_scale is None else in_scale.to(DEVICE))
    layer = torch.nn.Module()
    layer.weight, layer.weight_scale, layer.input_scale = wq, ws, in_scale
    want = ref.Fp8Linear("static" if static else "token").apply(layer, normed, None)
    assert y.dtype == dtype
    _same_sum(y_sum.cpu(), want_sum)
    torch.testing.assert_close(y.cpu().float(), want.float(), rtol=2e-2,
                               atol=2e-2 * want.float().abs().max().item())


def _same_sum(out, want):
    """The reference add's values; in bf16 on the interpreter, which truncates where torch
    and the GPU round, within one bf16 step."""
    if want.dtype == torch.float32 or not INTERPRET:
        assert torch.equal(out, want)
    else:
        assert ((out.float() - want.float()).abs() <= want.float().abs() * 2 ** -7).all()


def test_no_rows_is_no_launch():
    q, scale = mod.quantize_rows(torch.empty(0, 64, device=DEVICE))
    assert q.shape == (0, 64) and scale.shape == (0, 1)


def _dequantized(wq, ws):
    return wq.double() * ws.double()


@pytest.mark.parametrize("m", [1, 3])
def test_decode_rows_take_the_gemv_unquantized(m, monkeypatch):
    """Where the GEMV has a config, the op is x @ (fp8 weight * scale)^T with x as it is
    (no activation rounding): float32 within float32 rounding of float64, and away from
    the W8A8 reference by about the activations' fp8 rounding."""
    x = _x(m, 64)
    wq, ws = _weight(40, 64)
    cfg = GemvConfig(block_n=16, block_k=32)
    monkeypatch.setattr(mod, "weight_config", lambda rows, w, dtype: cfg if rows <= 4 else None)
    y = torch.ops.loom.fp8_linear(x.to(DEVICE), wq.to(DEVICE), ws.to(DEVICE), None)
    want = x.double() @ _dequantized(wq, ws).T
    torch.testing.assert_close(y.cpu().double(), want, rtol=1e-5, atol=1e-5)
    xq, xs = ref.quantize_rows(x)
    w8a8 = (xq.double() * xs.double()) @ _dequantized(wq, ws).T
    assert (y.cpu().double() - w8a8).abs().max() > 1e-4


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_more_rows_take_the_scaled_gemm(static, monkeypatch):
    """Past the GEMV's rows: quantized as the reference quantizes, multiplied by the scaled
    GEMM (bf16 out, back to x's dtype): the reference's float32 product within bf16
    rounding. The GEMV is never asked."""
    asked = []
    monkeypatch.setattr(mod, "gemv", lambda *a, **k: asked.append(a))
    x = _x(20, 64)
    wq, ws = _weight(48, 64)
    layer = torch.nn.Module()
    layer.weight, layer.weight_scale = wq, ws
    layer.input_scale = torch.tensor([0.04]) if static else None
    y = torch.ops.loom.fp8_linear(
        x.to(DEVICE), wq.to(DEVICE), ws.to(DEVICE),
        None if layer.input_scale is None else layer.input_scale.to(DEVICE))
    method = ref.Fp8Linear("static" if static else "token")
    want = method.apply(layer, x, None)  # the CPU reference
    assert y.dtype == torch.float32 and not asked
    torch.testing.assert_close(y.cpu(), want, rtol=1e-2, atol=1e-2 * want.abs().max().item())


def test_weight_config_of_fp8_weights(monkeypatch):
    """fp8 weights take the fp8 table; with none for the GPU, the bf16 table's tile with
    twice the chunk width (the same bytes a chunk); none where bf16 has none, and never
    past MAX_M rows."""
    from loom.kernels import gemv_decode
    bf16 = GemvConfig(block_n=16, block_k=256, split_k=2)
    monkeypatch.setattr(gemv_decode, "_has_fp8_table", lambda gpu: False)
    monkeypatch.setattr(gemv_decode, "tuned_config", lambda m, n, k, dtype, device: (
        bf16 if dtype == torch.bfloat16 and n == 48 else None))
    w = torch.empty(48, 64, dtype=mod.FP8)
    config = gemv_decode.weight_config
    assert config(1, w, torch.bfloat16) == GemvConfig(block_n=16, block_k=512, split_k=2)
    assert config(17, w, torch.bfloat16) is None
    assert config(1, torch.empty(32, 64, dtype=mod.FP8), torch.bfloat16) is None
    monkeypatch.setattr(gemv_decode, "_has_fp8_table", lambda gpu: True)
    assert config(1, w, torch.bfloat16) is None  # the fp8 table decides: it has no entry


_OFFLINE_COMPILE = r"""
from loom.kernels.fp8_linear import _quantize_rows_kernel
from loom.kernels.gemv import _gemv_kernel

def check(fn, types, cons, warps):
    ptx = build(fn, types, cons, warps)
    # fp8 conversions in hardware, and 16-byte loads (or asynchronous copies) of the rows
    print(fn.__name__, "e4m3x2" in ptx,
          "ld.global.v4" in ptx or "cp.async.cg.shared.global" in ptx)

quant = {"x_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "in_scale_ptr": "*fp32",
         "res_ptr": "*bf16", "nw_ptr": "*bf16", "res_out_ptr": "*bf16", "eps": "fp32"}
check(_quantize_rows_kernel, quant,
      dict(K=14336, BLOCK=16384, STATIC=False, FMAX=448.0, EPS_=1.2e-7), 16)
check(_quantize_rows_kernel, quant,
      dict(K=14336, BLOCK=16384, STATIC=False, FMAX=448.0, EPS_=1.2e-7, SILU_MUL=True), 16)
check(_quantize_rows_kernel, quant,
      dict(K=4096, BLOCK=4096, STATIC=False, FMAX=448.0, EPS_=1.2e-7, ADD_NORM=True), 4)
types = {"x_ptr": "*bf16", "w_ptr": "*fp8e4nv", "ws_ptr": "*fp32", "y_ptr": "*bf16",
         "part_ptr": "*fp32", "count_ptr": "*i32", "res_ptr": "*bf16", "nw_ptr": "*bf16",
         "res_out_ptr": "*bf16", "eps": "fp32"}
gemv = dict(M=1, K=4096, BLOCK_N=16, BLOCK_K=512, SPLIT_K=1, SPLIT_MODE=0, USE_DOT=False,
            SILU_MUL=False, EVEN_N=True, DOT_PRECISION="tf32", NUM_STAGES=3, PDL=False,
            PREFETCH_BYTES=0, ADD_NORM=False, W_SCALE=True)
check(_gemv_kernel, types, gemv, 4)
check(_gemv_kernel, types, dict(gemv, M=8, USE_DOT=True, SPLIT_K=2, SPLIT_MODE=1), 4)
check(_gemv_kernel, types, dict(gemv, SILU_MUL=True, K=14336), 4)
"""


def test_fp8_kernels_compile_for_sm90_offline():
    """The fp8 paths compile for the H200 with Triton's own ptxas (no GPU here): the
    conversions to and from fp8 are the hardware's, and the rows and weights are read 16
    bytes at a time (asynchronous copies in the GEMV's pipelined loop)."""
    from tests.triton_interpreter import SM90_BUILD, compile_for_sm90_offline
    assert compile_for_sm90_offline(SM90_BUILD + _OFFLINE_COMPILE).splitlines() == [
        "_quantize_rows_kernel True True"] * 3 + ["_gemv_kernel True True"] * 3
