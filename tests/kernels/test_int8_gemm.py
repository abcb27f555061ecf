"""The int8 W8A8 GEMMs (loom.kernels.int8_gemm) against torch's exact integer matmul: the
sums in int64, the scales applied in float64 and rounded once to the output dtype.

Both paths sum in int32, exactly, and scale in float32: a float32 output is within a few
float32 roundings of the reference, a bfloat16 or float16 one within one step of its dtype
(on the CPU interpreter, which truncates float32 to bfloat16 where the GPU rounds, too).
Values span int8's full range, and one check's sums pass 2^24, where a float accumulator
would drop units. Shapes have ragged M, N and K tails; the Triton GEMM also takes N and K
that no tile or K step divides.

On the CPU the kernels run in Triton's interpreter and torch._int_mm is torch's CPU kernel;
with CUDA the same checks run on the GPU (cuBLAS's int8 GEMM), against the reference
computed on the CPU. Every check draws fresh inputs; outputs are never preallocated.
"""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels import int8_gemm as mod  # noqa: E402
from loom.kernels.int8_gemm import (Int8GemmConfig, default_config, int8_gemm,  # noqa: E402
                                    int_mm_gemm)
from loom.kernels.interpreter import interpreted  # noqa: E402

INTERPRET = interpreted(mod._int8_gemm_kernel)
DEVICE = "cpu" if INTERPRET else "cuda"
_seed = iter(range(1000))

SMALL = Int8GemmConfig(16, 16, 32, group_m=1, num_warps=4, num_stages=1)
SWIZZLED = Int8GemmConfig(16, 32, 32, group_m=2, num_warps=4, num_stages=1)
"""Small tiles for the interpreter (the smallest an int8 dot takes on the GPU): one row tile
a band, and bands of two row tiles that leave a last band of one at M = 33."""

TOLERANCE = {torch.float32: dict(rtol=2 ** -21, atol=0.0),
             torch.bfloat16: dict(rtol=2 ** -7, atol=1e-6),
             torch.float16: dict(rtol=2 ** -10, atol=2 ** -24)}
"""float32: the reference's one rounding and the kernels' three (int32 to float32, then two
products); bfloat16 and float16: one step of the dtype (float16's subnormal step below
2^-14)."""

OUT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(m, n, k, weight_scale_shape="column"):
    """Full-range int8 values; scales as amax / 127.5 would make them for values of about
    unit size, one row's and one column's a hundred times larger."""
    gen = torch.Generator().manual_seed(next(_seed))
    xq = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    weight = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    x_scale = (0.5 + torch.rand(m, 1, generator=gen)) / 127.5
    weight_scale = (0.5 + torch.rand(n, 1, generator=gen)) / 127.5 / k ** 0.5
    x_scale[0] *= 100
    weight_scale[-1] *= 100
    if weight_scale_shape == "flat":
        weight_scale = weight_scale.reshape(n)
    return xq, x_scale, weight, weight_scale


def _reference(xq, x_scale, weight, weight_scale, out_dtype):
    """Exact integer sums (int64), scaled in float64, rounded once."""
    sums = xq.to(torch.int64) @ weight.to(torch.int64).T
    scales = x_scale.double() * weight_scale.double().reshape(1, -1)
    return (sums.double() * scales).to(out_dtype)


def _run(fn, xq, x_scale, weight, weight_scale, out_dtype, **kwargs):
    args = (t.to(DEVICE) for t in (xq, x_scale, weight, weight_scale))
    y = fn(*args, out_dtype, **kwargs)
    assert y.dtype == out_dtype and y.shape == (xq.shape[0], weight.shape[0])
    assert y.device.type == DEVICE and y.is_contiguous()
    y = y.cpu()
    assert not y.isnan().any()
    return y


def _check(y, xq, x_scale, weight, weight_scale, out_dtype):
    want = _reference(xq, x_scale, weight, weight_scale, out_dtype)
    torch.testing.assert_close(y.float(), want.float(), **TOLERANCE[out_dtype])


# (M, N, K): ragged M; N and K multiples of 8 that the tiles and K steps do not divide;
# N = 24 and K = 40 part of a 16-column tile and a 32-deep K step.
SHAPES = [(1, 8, 16), (5, 40, 48), (33, 72, 80), (5, 24, 40), (17, 16, 8)]


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("config", [SMALL, SWIZZLED], ids=["small", "swizzled"])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_triton_gemm_is_the_exact_sum_scaled(m, n, k, config, out_dtype):
    for _ in range(2):
        inputs = _inputs(m, n, k)
        _check(_run(int8_gemm, *inputs, out_dtype, config=config), *inputs, out_dtype)


@pytest.mark.parametrize("m, n, k", [(3, 50, 70), (33, 9, 33)])
def test_triton_gemm_takes_n_and_k_of_any_size(m, n, k):
    """N and K not multiples of 8 (which torch._int_mm refuses on CUDA): masked tails."""
    inputs = _inputs(m, n, k)
    _check(_run(int8_gemm, *inputs, torch.bfloat16, config=SMALL), *inputs, torch.bfloat16)


@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("m, n, k", SHAPES + [(16, 8, 32), (17, 8, 32)])
def test_int_mm_gemm_is_the_exact_sum_scaled(m, n, k, out_dtype):
    """cuBLAS's int8 GEMM (torch's CPU one here) and the scaling pass; 16 rows and fewer
    are multiplied padded to 17, and only their own rows come back."""
    for _ in range(2):
        inputs = _inputs(m, n, k)
        _check(_run(int_mm_gemm, *inputs, out_dtype), *inputs, out_dtype)


@pytest.mark.parametrize("weight_scale_shape", ["column", "flat"])
def test_both_paths_agree_bit_for_bit(weight_scale_shape):
    """The same exact int32 sums, scaled by the same float32 products in the same order:
    the same bits, whether the weight's scales are [N, 1] or [N]."""
    inputs = _inputs(33, 40, 48, weight_scale_shape)
    for out_dtype in OUT_DTYPES:
        fused = _run(int8_gemm, *inputs, out_dtype, config=SWIZZLED)
        split = _run(int_mm_gemm, *inputs, out_dtype)
        assert torch.equal(fused, split)
        _check(fused, *inputs, out_dtype)


def test_default_config_runs_and_fits_the_tensor_cores():
    """The default tiles (whatever a benchmark makes of them) keep to what int8 tl.dot
    needs on the GPU: powers of two, at least 16 rows and columns and 32-deep K steps."""
    for m in (1, 5, 16, 17, 33, 64, 100, 128, 8192):
        cfg = default_config(m)
        for block in (cfg.block_m, cfg.block_n, cfg.block_k):
            assert block >= 16 and block & (block - 1) == 0
        assert cfg.block_k >= 32 and cfg.group_m >= 1
    inputs = _inputs(5, 72, 136)
    _check(_run(int8_gemm, *inputs, torch.bfloat16), *inputs, torch.bfloat16)


def test_sums_past_float_precision_are_exact():
    """Unit scales, so a float32 output is the int32 sum itself, rounded once. Row 0 against
    column 0: -128 * -128 over K = 2080, 34078720, past float16's range and 2^24. Row 1
    against column 1: 1024 products of 16384 (2^24), a lone 1 in the next 32-deep step,
    then 1024 of -16256: 131073, where a float32 accumulator holding 2^24 + 1 drops the 1."""
    k = 2080
    xq = torch.randint(-128, 128, (3, k), generator=torch.Generator().manual_seed(7),
                       dtype=torch.int8)
    weight = torch.randint(-128, 128, (8, k), generator=torch.Generator().manual_seed(8),
                           dtype=torch.int8)
    xq[0], weight[0] = -128, -128
    xq[1], weight[1] = -128, 127
    weight[1, :1024] = -128
    xq[1, 1024:1056], weight[1, 1024:1056] = 0, 0
    xq[1, 1040], weight[1, 1040] = 1, 1
    ones = torch.ones(3, 1), torch.ones(8, 1)
    sums = xq.to(torch.int64) @ weight.to(torch.int64).T
    assert sums[0, 0] == 2080 * 16384 and sums[1, 1] == 2 ** 24 + 1 - 1024 * 16256
    want = sums.to(torch.float32)
    for fn, kwargs in ((int8_gemm, dict(config=SMALL)), (int8_gemm, {}), (int_mm_gemm, {})):
        y = _run(fn, xq, ones[0], weight, ones[1], torch.float32, **kwargs)
        assert torch.equal(y, want), fn.__name__


@pytest.mark.parametrize("fn", [int8_gemm, int_mm_gemm])
def test_no_rows_is_no_launch(fn):
    xq = torch.empty(0, 32, dtype=torch.int8, device=DEVICE)
    x_scale = torch.empty(0, 1, device=DEVICE)
    weight = torch.zeros(16, 32, dtype=torch.int8, device=DEVICE)
    y = fn(xq, x_scale, weight, torch.ones(16, device=DEVICE), torch.bfloat16)
    assert y.shape == (0, 16) and y.dtype == torch.bfloat16 and y.device.type == DEVICE


def _bad(case):
    """Valid operands for a 4 x 16 x 32 GEMM, then one thing wrong with them."""
    xq, x_scale, weight, weight_scale = (t.to(DEVICE) for t in _inputs(4, 16, 32))
    out_dtype = torch.bfloat16
    if case == "x dtype":
        xq = xq.to(torch.int32)
    elif case == "weight dtype":
        weight = weight.to(torch.uint8)
    elif case == "scale dtype":
        x_scale = x_scale.to(torch.bfloat16)
    elif case == "out dtype":
        out_dtype = torch.int32
    elif case == "k":
        weight = weight[:, :16].contiguous()
    elif case == "3-d":
        xq = xq[None]
    elif case == "x scale shape":
        x_scale = x_scale.reshape(4)
    elif case == "weight scale shape":
        weight_scale = weight_scale[:8]
    elif case == "strided":
        xq = xq.t().contiguous().t()
    elif case == "long k":
        xq = xq.new_zeros(4, 1 << 17)
        weight = weight.new_zeros(16, 1 << 17)
    elif case == "device":
        x_scale = torch.empty(4, 1, device="meta")
    return xq, x_scale, weight, weight_scale, out_dtype


ERRORS = {"x dtype": "must be int8", "weight dtype": "must be int8",
          "scale dtype": "must be float32", "out dtype": "out_dtype must be bfloat16",
          "k": r"shapes do not fit: \(4, 32\) and \(16, 16\)",
          "3-d": "shapes do not fit", "x scale shape": r"must be \(4, 1\) and \(16, 1\)",
          "weight scale shape": r"scale shapes \(4, 1\) and \(8, 1\)",
          "strided": "must be contiguous", "long k": r"K \(131072\) must be below 2\^17",
          "device": "different devices"}


@pytest.mark.parametrize("fn", [int8_gemm, int_mm_gemm])
@pytest.mark.parametrize("case", list(ERRORS))
def test_bad_operands_are_refused(fn, case):
    with pytest.raises(ValueError, match=f"{fn.__name__}: .*{ERRORS[case]}"):
        fn(*_bad(case))


def test_int_mm_refuses_k_or_n_not_a_multiple_of_8():
    for m, n, k in ((20, 16, 36), (20, 12, 32)):
        inputs = (t.to(DEVICE) for t in _inputs(m, n, k))
        with pytest.raises(ValueError, match="must be multiples of 8"):
            int_mm_gemm(*inputs, torch.float16)


def test_bad_tiles_are_refused():
    inputs = [t.to(DEVICE) for t in _inputs(4, 16, 32)]
    for config in (Int8GemmConfig(16, 16, 16), Int8GemmConfig(8, 16, 32),
                   Int8GemmConfig(16, 48, 32), Int8GemmConfig(16, 16, 32, group_m=0)):
        with pytest.raises(ValueError, match="powers of two >= 16"):
            int8_gemm(*inputs, torch.float32, config=config)
