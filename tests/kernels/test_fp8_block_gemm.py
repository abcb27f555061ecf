"""The block-wise fp8 kernels (loom.kernels.fp8_block_gemm) against the float32 reference
(loom.quantization.fp8_block), on tiny shapes: ragged rows, and N and K that are not whole
blocks (ceil-sized scales).

On the CPU they run in Triton's interpreter (TRITON_INTERPRET=1); with CUDA the same checks
run the compiled kernels, against the reference computed on the CPU. Activations must
quantize to the very bytes and scales the CPU computes; the GEMM's sums differ from the
reference's only in float32 summation order (and bfloat16 rounding of the output). On an
H200 they differ more: Hopper's fp8 tensor cores accumulate a dot's products below float32
precision (each k-block's sum is then added to the float32 accumulator, as DeepSeek-V3's
GEMMs promote theirs), measured at 5e-4 of the output's range over 64-wide blocks. Every
check draws fresh inputs and poisons the outputs first, so a value a kernel failed to write
cannot pass for one it wrote.
"""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels.fp8_block_gemm import (FP8, BlockGemmConfig, block_gemm,  # noqa: E402
                                         quantize_groups)
from loom.kernels.interpreter import interpreted, patch_interpreter  # noqa: E402
from loom.kernels import fp8_block_gemm as mod  # noqa: E402
from loom.quantization import fp8_block as ref  # noqa: E402

INTERPRET = interpreted(mod._block_gemm_kernel)
DEVICE = "cpu" if INTERPRET else "cuda"
if INTERPRET:
    patch_interpreter()  # fp8 conversion rounded as the GPU's

# (M, N, K, (block rows, block cols)): ragged M; N and K not whole blocks; blocks taller
# than a tile and shorter than one; one wider than 16-row tiles.
SHAPES = [(1, 64, 64, (32, 32)), (5, 50, 70, (16, 32)), (17, 96, 128, (64, 32)),
          (33, 40, 96, (32, 64))]
_seed = iter(range(1000))


def _inputs(m, n, k, block, dtype=torch.float32):
    gen = torch.Generator().manual_seed(next(_seed))
    x = (torch.randn(m, k, generator=gen) * 4).to(dtype)
    x[0, : k // 3] *= 50  # one group with a far larger range than its row's others
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    return x, ref.quantize_blocks(w, block)


def _poisoned(*shape, dtype):
    t = torch.empty(*shape, dtype=dtype, device=DEVICE)
    return t.fill_(float("nan")) if dtype != FP8 else t.view(torch.uint8).fill_(0x7F).view(FP8)


@pytest.mark.parametrize("m, n, k, block", SHAPES)
def test_activations_quantize_to_the_references_bytes(m, n, k, block):
    for _ in range(2):
        x, _ = _inputs(m, n, k, block)
        groups = ref.cdiv(k, block[1])
        q, scale = _poisoned(m, k, dtype=FP8), _poisoned(m, groups, dtype=torch.float32)
        quantize_groups(x.to(DEVICE), block[1], out=(q, scale))
        want_q, want_scale = ref.quantize_groups(x, block[1])
        assert torch.equal(scale.cpu(), want_scale)
        assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))


def _check_gemm(m, n, k, block, config, dtype=torch.float32):
    x, (wq, ws) = _inputs(m, n, k, block, dtype)
    xq, x_scale = ref.quantize_groups(x, block[1])
    want = ref.dequantize(xq, x_scale, 1, block[1]) @ ref.dequantize(wq, ws, *block).t()
    out = _poisoned(m, n, dtype=dtype)
    got = block_gemm(xq.to(DEVICE), x_scale.to(DEVICE), wq.to(DEVICE), ws.to(DEVICE), block,
                     dtype, config, out=out)
    assert got is out
    _close(got, want, dtype)


def _close(got, want, dtype):
    rel = 1e-2 if dtype != torch.float32 else 1e-5 if INTERPRET else 2e-3
    torch.testing.assert_close(got.cpu().float(), want, rtol=rel,
                               atol=rel * want.abs().max().item())


@pytest.mark.parametrize("m, n, k, block", SHAPES)
def test_gemm_matches_the_float32_reference(m, n, k, block):
    """The default tiles, then 16 x 16 tiles (several per weight block, so each tile reads
    the scale of its own rows) stepping K in 32s (two steps per 64-wide group), their
    programs swizzled two row tiles at a time (the last group one tile high)."""
    _check_gemm(m, n, k, block, None)
    _check_gemm(m, n, k, block, BlockGemmConfig(16, 16, 32, num_stages=2, swizzle_m=2))


def test_bfloat16_out():
    _check_gemm(9, 96, 128, (32, 32), None, torch.bfloat16)


def test_the_op_quantizes_and_multiplies():
    """`loom::fp8_block_linear`, as a layer calls it: x in, x's dtype out."""
    x, (wq, ws) = _inputs(6, 64, 96, (32, 32))
    got = torch.ops.loom.fp8_block_linear(x.to(DEVICE), wq.to(DEVICE), ws.to(DEVICE), 32, 32)
    _close(got, ref.block_matmul(x, wq, ws, (32, 32)), torch.float32)


@pytest.mark.skipif(INTERPRET, reason="cuBLASLt's block-wise scaled_mm needs CUDA")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 33])
def test_the_op_at_128_blocks(m, dtype):
    """Qwen3's 128 x 128 blocks, which cuBLASLt multiplies on sm_90 (the Triton GEMM
    elsewhere): the same quantized values, the same sums."""
    x, (wq, ws) = _inputs(m, 256, 512, (128, 128), dtype)
    got = torch.ops.loom.fp8_block_linear(x.to(DEVICE), wq.to(DEVICE), ws.to(DEVICE), 128, 128)
    assert got.dtype == dtype
    _close(got, ref.block_matmul(x.float(), wq, ws, (128, 128)), dtype)


def test_bad_scales_are_refused():
    x, (wq, ws) = _inputs(2, 64, 64, (32, 32))
    xq, x_scale = ref.quantize_groups(x, 32)
    with pytest.raises(ValueError, match=r"scales .* do not fit"):
        block_gemm(xq, x_scale, wq, ws[:1], (32, 32), torch.float32)
    with pytest.raises(ValueError, match=r"block_k 64 must divide the scale group 32"):
        block_gemm(xq, x_scale, wq, ws, (32, 32), torch.float32, BlockGemmConfig(16, 16, 64))
