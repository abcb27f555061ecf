"""`loom::fp8_linear` with int8 weights (W8A8-INT8 checkpoints) against loom's CPU reference
(loom.quantization.fp8 with dtype int8, itself checked against compressed-tensors in
tests/quantization/test_int8_w8a8.py): the Triton per-token quantization to the
reference's very bytes (ties rounded to even), the GEMV at decode rows (W8A16), the int8
GEMM past them, and which rows take which; and the int8 kernels compiled for sm_90.

On the CPU the kernels run in Triton's interpreter; with CUDA the same checks run on the
GPU. Every check draws fresh inputs.
"""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels import fp8_linear as mod  # noqa: E402
from loom.kernels.gemv import GemvConfig  # noqa: E402
from loom.kernels.interpreter import interpreted  # noqa: E402
from loom.quantization import fp8 as ref  # noqa: E402
from tests.kernels.test_fp8_linear import _x  # noqa: E402  (fresh rows, one far larger)

INTERPRET = interpreted(mod._quantize_rows_kernel)
DEVICE = "cpu" if INTERPRET else "cuda"
INT8 = torch.int8


def _weight(n, k):
    gen = torch.Generator().manual_seed(n * 1000 + k)
    return ref.quantize_rows(torch.randn(n, k, generator=gen) / k ** 0.5, INT8)


@pytest.mark.parametrize("m, k", [(1, 64), (3, 80), (5, 200)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_quantize_to_the_references_bytes(m, k, dtype):
    """Per token: amax / 127.5 and round(clamp(x / scale)), the reference's bytes."""
    for _ in range(2):
        x = _x(m, k, dtype)
        q, scale = mod.quantize_rows(x.to(DEVICE), dtype=INT8)
        want_q, want_scale = ref.quantize_rows(x, INT8)
        assert q.dtype == INT8 and q.shape == (m, k) and scale.shape == (m, 1)
        assert torch.equal(scale.cpu(), want_scale)
        assert torch.equal(q.cpu(), want_q)


def test_ties_round_to_even_and_the_largest_value_clamps():
    """A row whose amax is 127.5 has scale 1: halves round to the even integer as
    torch.round does (and compressed-tensors), and +-127.5 itself clamps to 127 / -128."""
    x = torch.tensor([[127.5, 2.5, 3.5, -0.5, -1.5, 0.49, 126.5, -127.5]])
    q, scale = mod.quantize_rows(x.to(DEVICE), dtype=INT8)
    assert scale.item() == 1.0
    assert q.cpu().tolist() == [[127, 2, 4, 0, -2, 0, 126, -128]]
    assert torch.equal(q.cpu(), ref.quantize_rows(x, INT8)[0])


def test_static_scale_saturates():
    x = _x(4, 96)
    static = torch.tensor([0.05])
    q, scale = mod.quantize_rows(x.to(DEVICE), static.to(DEVICE), dtype=INT8)
    assert torch.equal(scale.cpu(), torch.full((4, 1), 0.05))
    assert torch.equal(q.cpu(), ref._quantize(x, static.reshape(1, 1), INT8))
    assert q.cpu()[0, 1] == 127  # 40 / 0.05 = 800


def test_silu_mul_and_norm_rows_quantize_to_int8():
    """The fused SiLU·mul and add + RMSNorm forms of the kernel write int8 too. The GPU's
    exp (SiLU) and the norm's sum of squares in another order round differently from
    torch's CPU ones: a scale a few ulps off, a value moved by one step."""
    import torch.nn.functional as F

    from loom.layers.norm import fused_add_rms_norm
    x = _x(3, 160)
    q, scale = mod.quantize_rows(x.to(DEVICE), silu_mul_input=True, dtype=INT8)
    want_q, want_scale = ref.quantize_rows(F.silu(x[:, :80]) * x[:, 80:], INT8)
    torch.testing.assert_close(scale.cpu(), want_scale, rtol=1e-6, atol=0)
    assert (q.cpu().int() - want_q.int()).abs().max() <= 1
    x, residual = _x(5, 96), _x(5, 96)
    norm_weight = 1 + 0.1 * _x(1, 96)[0]
    normed, want_sum = fused_add_rms_norm(x, residual, norm_weight, 1e-5)
    q, scale, out_sum = mod.add_rms_norm_quantize_rows(
        x.to(DEVICE), residual.to(DEVICE), norm_weight.to(DEVICE), 1e-5, dtype=INT8)
    want_q, want_scale = ref.quantize_rows(normed, INT8)
    assert q.dtype == INT8 and torch.equal(out_sum.cpu(), want_sum)
    torch.testing.assert_close(scale.cpu(), want_scale, rtol=1e-5, atol=0)
    assert (q.cpu().int() - want_q.int()).abs().max() <= 1


def _layer(wq, ws, input_scale=None):
    layer = torch.nn.Module()
    layer.weight, layer.weight_scale, layer.input_scale = wq, ws, input_scale
    return layer


@pytest.mark.parametrize("m", [1, 3])
def test_decode_rows_take_the_gemv_unquantized(m, monkeypatch):
    """Where the GEMV has a config: x @ (int8 weight * scale)^T with x as it is, within
    float32 rounding of float64, and away from the W8A8 reference by the activations'
    int8 rounding."""
    x = _x(m, 64)
    wq, ws = _weight(40, 64)
    cfg = GemvConfig(block_n=16, block_k=32)
    monkeypatch.setattr(mod, "weight_config", lambda rows, w, dtype: cfg if rows <= 4 else None)
    y = torch.ops.loom.fp8_linear(x.to(DEVICE), wq.to(DEVICE), ws.to(DEVICE), None)
    dequantized = wq.double() * ws.double()
    torch.testing.assert_close(y.cpu().double(), x.double() @ dequantized.T, rtol=1e-5,
                               atol=1e-5)
    w8a8 = ref.Fp8Linear("token", dtype=INT8).apply(_layer(wq, ws), x, None)
    assert (y.cpu() - w8a8).abs().max() > 1e-4


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_more_rows_take_the_int8_gemm(static, dtype, monkeypatch):
    """Past the GEMV's rows: quantized as the reference quantizes and multiplied with int32
    sums, scaled once: float32 out is the reference's within float32 rounding (its float32
    sums of integer products are exact at this K). The GEMV is never asked."""
    asked = []
    monkeypatch.setattr(mod, "gemv", lambda *a, **k: asked.append(a))
    x = _x(20, 64, dtype)
    wq, ws = _weight(48, 64)
    in_scale = torch.tensor([0.04]) if static else None
    y = torch.ops.loom.fp8_linear(x.to(DEVICE), wq.to(DEVICE), ws.to(DEVICE),
                                  None if in_scale is None else in_scale.to(DEVICE))
    method = ref.Fp8Linear("static" if static else "token", dtype=INT8)
    want = method.apply(_layer(wq, ws, in_scale), x.float(), None)
    assert y.dtype == dtype and not asked
    tol = 1e-6 if dtype == torch.float32 else 2 ** -7
    torch.testing.assert_close(y.cpu().float(), want, rtol=tol, atol=tol * want.abs().max())


def test_int8_weights_take_fp8s_gemv_tiles(monkeypatch):
    """int8 weights are as many bytes as fp8's: the fp8 table where the GPU has one, else
    the bf16 table's tile at twice its chunk width."""
    from loom.kernels import gemv_decode
    seen = []

    def tuned(m, n, k, dtype, device):
        seen.append(dtype)
        return GemvConfig(block_n=16, block_k=256)
    monkeypatch.setattr(gemv_decode, "tuned_config", tuned)
    w = torch.empty(48, 64, dtype=INT8)
    monkeypatch.setattr(gemv_decode, "_has_fp8_table", lambda gpu: False)
    assert gemv_decode.weight_config(1, w, torch.bfloat16).block_k == 512
    monkeypatch.setattr(gemv_decode, "_has_fp8_table", lambda gpu: True)
    assert gemv_decode.weight_config(1, w, torch.bfloat16).block_k == 256
    assert seen == [torch.bfloat16, ref.FP8]
    assert gemv_decode.weight_config(17, w, torch.bfloat16) is None


_OFFLINE_COMPILE = r"""
import re
from loom.kernels.fp8_linear import _quantize_rows_kernel
from loom.kernels.gemv import _gemv_kernel
from loom.kernels.int8_gemm import _int8_gemm_kernel

quant = {"x_ptr": "*bf16", "q_ptr": "*i8", "s_ptr": "*fp32", "in_scale_ptr": "*fp32",
         "res_ptr": "*bf16", "nw_ptr": "*bf16", "res_out_ptr": "*bf16", "eps": "fp32"}
ptx = build(_quantize_rows_kernel, quant, dict(K=4096, BLOCK=4096, STATIC=False, FMAX=127.5,
                                               EPS_=1.2e-7, ADD_NORM=True, INT=True), 4)
print("quantize", re.search(r"cvt\.rzi\.s(8|16|32)\.f32", ptx) is not None)
gemm = {"a_ptr": "*i8", "as_ptr": "*fp32", "b_ptr": "*i8", "bs_ptr": "*fp32", "c_ptr": "*bf16"}
ptx = build(_int8_gemm_kernel, gemm, dict(N=4096, K=4096, BLOCK_M=128, BLOCK_N=128,
                                          BLOCK_K=128, GROUP_M=8), 8, stages=4,
            aligned=("stride_a", "stride_b", "stride_c"))
print("gemm", re.search(r"wgmma\.mma_async\S*\.s32\.s8\.s8", ptx) is not None)
types = {"x_ptr": "*bf16", "w_ptr": "*i8", "ws_ptr": "*fp32", "y_ptr": "*bf16",
         "part_ptr": "*fp32", "count_ptr": "*i32", "res_ptr": "*bf16", "nw_ptr": "*bf16",
         "res_out_ptr": "*bf16", "eps": "fp32"}
gemv = dict(M=1, K=4096, BLOCK_N=16, BLOCK_K=512, SPLIT_K=1, SPLIT_MODE=0, USE_DOT=False,
            SILU_MUL=False, EVEN_N=True, DOT_PRECISION="tf32", NUM_STAGES=3, PDL=False,
            PREFETCH_BYTES=0, ADD_NORM=False, W_SCALE=True)
ptx = build(_gemv_kernel, types, gemv, 4)
print("gemv", re.search(r"cvt\.rn\.f32\.s(8|16|32)", ptx) is not None)
"""


def test_int8_kernels_compile_for_sm90_offline():
    """The int8 paths compile for the H200 with Triton's own ptxas (no GPU here): the
    quantization converts to integers in hardware, the GEMM's int8 tiles go to Hopper's
    int8 wgmma (int32 accumulators), the GEMV widens int8 weights to float."""
    from tests.triton_interpreter import SM90_BUILD, compile_for_sm90_offline
    assert compile_for_sm90_offline(SM90_BUILD + _OFFLINE_COMPILE).splitlines() == [
        "quantize True", "gemm True", "gemv True"]
