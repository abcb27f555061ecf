"""The fused add + RMSNorm kernel (the all-reduce kernel with one rank) against the eager
reference `fused_add_rms_norm`, on the CPU under the Triton interpreter. The cross-GPU
path (WORLD > 1) needs peer memory: tests/distributed/test_all_reduce_norm_gpu.py."""

from __future__ import annotations

import pytest
import torch
from triton.runtime.interpreter import InterpretedFunction

from loom.kernels.all_reduce_norm import _all_reduce_add_rms_norm_kernel, add_rms_norm
from loom.layers.norm import fused_add_rms_norm

# Interpreted on the CPU (CI); compiled on CUDA tensors where a GPU runs the suite.
INTERPRET = isinstance(_all_reduce_add_rms_norm_kernel, InterpretedFunction)
DEVICE = "cpu" if INTERPRET else "cuda"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(1, 64), (3, 100), (5, 256)])
def test_add_rms_norm_matches_reference(dtype, rows, width):
    gen = torch.Generator().manual_seed(rows * 1000 + width)
    x = (torch.randn(rows, width, generator=gen).to(dtype) * 3).to(DEVICE)
    residual = torch.randn(rows, width, generator=gen).to(dtype).to(DEVICE)
    weight = (torch.rand(width, generator=gen) + 0.5).to(dtype).to(DEVICE)
    out, res = add_rms_norm(x, residual, weight, 1e-5)
    ref_out, ref_res = fused_add_rms_norm(x, residual, weight, 1e-5)
    assert out.dtype == ref_out.dtype and res.dtype == ref_res.dtype
    if dtype == torch.float32 or not INTERPRET:
        torch.testing.assert_close(res, ref_res, rtol=0, atol=0)  # one rounding in both
    else:
        # The interpreter truncates float32 -> bfloat16 casts (the GPU rounds to nearest),
        # so each rounding may differ by one bfloat16 ulp here.
        torch.testing.assert_close(res, ref_res, rtol=2 ** -7, atol=1e-2)
    if dtype == torch.float32:
        torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    else:  # the norm's sum runs in another order: the result may land one ulp apart
        torch.testing.assert_close(out, ref_out, rtol=2 ** -6, atol=2e-2)

def test_add_rms_norm_reads_strided_rows_and_keeps_leading_dims():
    x = torch.randn(2, 3, 64, device=DEVICE)
    residual = torch.randn(2, 3, 128, device=DEVICE)[..., ::2]  # not contiguous
    weight = torch.rand(64, device=DEVICE)
    out, res = add_rms_norm(x, residual, weight, 1e-6)
    ref_out, ref_res = fused_add_rms_norm(x, residual, weight, 1e-6)
    assert out.shape == (2, 3, 64)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(res, ref_res)
