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


def test_sweep_and_rows_json_on_the_cpu(tmp_path):
    """The kernel benchmarks' loop and --output-json, run on the CPU (the timer falls back to
    perf_counter): every projection at every row count, then the rows with their provenance."""
    import argparse
    import json

    from loom.bench.ceilings import Ceilings
    from loom.bench.int4 import sweep, write_rows
    args = argparse.Namespace(num_iters_warmup=0, num_iters=1, seed=0, model="m",
                              tensor_parallel_size=1, output_json=str(tmp_path / "r.json"))
    shapes = {"a": (8, 4), "b": (4, 8)}
    seen = [(p, s, m) for p, s, m, timer, gen in sweep(shapes, [1, 2], torch.device("cpu"), args)]
    assert seen == [("a", (8, 4), 1), ("a", (8, 4), 2), ("b", (4, 8), 1), ("b", (4, 8), 2)]
    write_rows(args, "w8a8", "cpu", Ceilings("cpu", 1.0, 2.0), 0.0, [{"m": 1}], bits=8)
    out = json.loads((tmp_path / "r.json").read_text())
    assert (out["benchmark"], out["bits"], out["rows"], out["ceilings"]["matmul_tflop_per_s"]) \
        == ("w8a8", 8, [{"m": 1}], 2.0)
    assert out["git_commit"] and out["command"]
