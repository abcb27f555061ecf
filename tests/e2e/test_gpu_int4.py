"""int4 (W4A16) checkpoints on the GPU, through `loom::int4_linear`'s Triton kernel, against
the CPU's float32 multiply of the same dequantized weights. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import make_tiny_model
from tests.e2e.test_gpu import _tokens  # the GPU tests' prompts: chunks beside decodes

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
pytest.importorskip("compressed_tensors")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from tests.quantization.int4_checkpoints import GROUP, as_awq, write_int4_checkpoint
    sym, asym = (str(tmp_path_factory.mktemp(n)) for n in ("sym", "asym"))
    write_int4_checkpoint(make_tiny_model("qwen3", str(tmp_path_factory.mktemp("b1"))), sym,
                          GROUP, True, ["lm_head"])
    write_int4_checkpoint(make_tiny_model("llama", str(tmp_path_factory.mktemp("b2"))), asym,
                          GROUP, False, ["lm_head"])
    return {"ct-sym": sym, "awq": as_awq(asym, str(tmp_path_factory.mktemp("awq")), GROUP, [])}


@pytest.mark.parametrize("case", ["ct-sym", "awq"])
@pytest.mark.parametrize("compilation", [dict(enforce_eager=True), dict(),
                                         dict(compilation_config={"level": 3})],
                         ids=["eager", "default", "level3"])
def test_gpu_int4_float32_equals_cpu(case, compilation, checkpoints):
    """float32 dots in the kernel ("ieee"), so the tokens are the CPU's: decode rows take the
    split-K regime, the 90-token prompt the tiled one."""
    path = checkpoints[case]
    cpu = _tokens(path, device="cpu", dtype="float32")
    assert _tokens(path, device="cuda", dtype="float32", **compilation) == cpu


def test_gpu_int4_bf16_first_tokens_equal_cpu(checkpoints):
    path = checkpoints["awq"]
    cpu = _tokens(path, device="cpu", dtype="float32")
    gpu = _tokens(path, device="cuda", dtype="bfloat16")
    assert sum(g[:2] == c[:2] for g, c in zip(gpu, cpu)) >= len(cpu) - 1
