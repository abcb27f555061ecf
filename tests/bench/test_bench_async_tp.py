"""`loom bench async-tp` on a tiny model at TP=2 on CPU (gloo): every run really happens,
and the table is what the runs' own JSON says."""

from __future__ import annotations

import json
import sys

import pytest

from loom.cli import main


@pytest.fixture(scope="module")
def table_run(tiny_model_factory, tmp_path_factory):
    path = tiny_model_factory("llama")[0]
    out = tmp_path_factory.mktemp("async-tp")
    argv = ["bench", "async-tp", "--model", path, "-tp", "2", "--input-lens", "16",
            "--graphs", "static", "--impls", "overlap", "--repeats", "1",
            "--num-iters-warmup", "0", "--num-iters", "1", "--result-dir", str(out),
            "-O", '{"cudagraph_mode": "NONE", "level": 1}',
            "--", "--device", "cpu", "--max-model-len", "64"]
    old, sys.argv = sys.argv, ["loom", *argv]
    try:
        rc = main(argv)
    finally:
        sys.argv = old
    return rc, out


def test_every_variant_runs_and_the_table_matches_its_runs(table_run, capsys):
    rc, out = table_run
    assert rc == 0
    table = json.loads((out / "table.json").read_text())
    assert table["command"].startswith("loom bench async-tp --model")
    (row,) = table["rows"]
    assert (row["input_len"], row["graph"]) == (16, "static")
    off = json.loads((out / "static16-off-r0.json").read_text())
    on = json.loads((out / "static16-overlap-r0.json").read_text())
    assert row["cells"]["off"]["mean_s"] == pytest.approx(off["avg_latency"])
    assert row["cells"]["overlap"]["ratio_to_off"] == pytest.approx(
        on["avg_latency"] / off["avg_latency"])
    # What each run was told: the compile sizes, and the passes on or off.
    for run, enabled in ((on, True), (off, False)):
        config = run["engine_args"]["compilation_config"]
        assert (config["level"], config["compile_sizes"]) == (3, [16])
        assert config["pass_config"]["enable_async_tp"] is enabled
        assert config["cudagraph_capture_sizes"] == []  # prefill only: nothing captured
        assert config["cudagraph_mode"] == "NONE"  # from -O; its level gave way to the table's
    # The passes really ran in the "on" run only (the suite forces sequence parallelism on).
    assert "loom overlap ops: rewrote" in (out / "static16-overlap-r0.log").read_text()
    assert "sequence_parallelism" not in (out / "static16-off-r0.log").read_text()


@pytest.mark.parametrize("flags, message", [
    (["--impls", "nccl"], "impls: unknown"),
    (["--graphs", "both"], "graphs: unknown"),
    (["--input-lens", "abc"], "input_lens"),
    (["-tp", "1"], "tensor_parallel_size"),
    (["-O", "[1]"], "compilation_config: expected a JSON object"),
])
def test_bad_flags_are_clear_errors(flags, message, capsys):
    assert main(["bench", "async-tp", "--model", "x", *flags]) == 2
    assert message in capsys.readouterr().err
