"""int8 W8A8 checkpoints on the GPU (`loom::fp8_linear` with int8 weights: the GEMV at
decode rows, per-token int8 rows through loom's Triton int8 GEMM past them) against the
CPU's float32 multiply of the same int8 values. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_tiny_model
from tests.e2e.test_gpu import _fp8_first_tokens_close

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
pytest.importorskip("compressed_tensors")


@pytest.mark.parametrize("compilation", [{}, {"level": 0}, {"cudagraph_mode": "FULL"}],
                         ids=["default", "eager", "full"])
@pytest.mark.parametrize("scheme", ["int8-dynamic", "int8-static"])
def test_gpu_int8_equals_cpu(scheme, compilation, tmp_path):
    """The int32 sums are exact on both; the GPU's decode rows are not quantized (W8A16),
    the CPU's are, which moves the tiny model's logprobs by about the activations' int8
    rounding amplified through the layers. A wrong scale or tile moves them by whole
    units."""
    from tests.quantization.fp8_checkpoints import write_fp8_checkpoint
    path = str(tmp_path / "int8")
    write_fp8_checkpoint(make_tiny_model("llama", str(tmp_path / "base")), path, scheme,
                         ["lm_head"])
    _fp8_first_tokens_close(path, compilation, 0.25, False)


@pytest.mark.parametrize("compilation", [{}, {"level": 0}], ids=["default", "eager"])
def test_gpu_experts_int8_equals_cpu(compilation, tiny_model_factory):
    """--quantization experts_int8: the fused MoE's 8-bit kernels against the CPU's float32
    multiply of the same dequantized experts (the rest unquantized on both)."""
    _fp8_first_tokens_close(tiny_model_factory("qwen3_moe")[0], compilation, 0.05, True,
                            quantization="experts_int8")
