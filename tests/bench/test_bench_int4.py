"""`loom bench int4` and `loom bench w8a8` on a machine without a GPU: their shapes, and
the errors they give."""

from __future__ import annotations

import pytest
import torch

from loom.bench.int4 import projections
from loom.bench.moe_space import model_config_json
from loom.cli import main


def test_llama_8b_projections_per_rank():
    hf = model_config_json("llama-3.1-8b")
    assert projections(hf, 1) == {"qkv_proj": (6144, 4096), "o_proj": (4096, 4096),
                                  "gate_up_proj": (28672, 4096), "down_proj": (4096, 14336)}
    assert projections(hf, 2)["qkv_proj"] == (3072, 4096)
    assert projections(hf, 2)["down_proj"] == (4096, 7168)
    with pytest.raises(ValueError, match=r"tensor_parallel_size: 3 does not divide the "
                                         r"attention heads \(32\)"):
        projections(hf, 3)


@pytest.mark.parametrize("argv, error", [
    (["--group-size", "24"], "group_size: 24 is not -1 or a multiple of 16"),
    (["--batch-sizes", "0"], "batch_sizes: must be positive"),
    ([], "int4: needs a CUDA GPU"),
])
def test_refusals(argv, error, capsys):
    if not argv and torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert main(["bench", "int4", *argv]) != 0
    assert error in capsys.readouterr().err


@pytest.mark.parametrize("argv, error", [
    (["--batch-sizes", "0"], "batch_sizes: must be positive"),
    (["--num-iters", "0"], "num_iters must be positive"),
    ([], "w8a8: needs a CUDA GPU"),
])
def test_w8a8_refusals(argv, error, capsys):
    if not argv and torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert main(["bench", "w8a8", *argv]) != 0
    assert error in capsys.readouterr().err
