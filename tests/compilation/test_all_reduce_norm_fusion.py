"""The all-reduce + norm fusion pass at TP=2 on the CPU (gloo, float32): every
all_reduce -> residual add -> RMSNorm site of a tiny model becomes one
`loom::all_reduce_add_rms_norm` node in the default (piecewise) compile, the embedding's
all-reduce stays, and the compiled TP=2 forward equals the eager one."""

from __future__ import annotations

import pytest

from tests.compilation.tp2_harness import Scenario, run_tp2

LAYERS = 2


def _total(report: dict, op: str) -> int:
    return sum(g["all_reduce_norm_fusion"][f"{op}.default"] for g in report["graphs"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_fusion_rewrites_every_residual_site_and_keeps_outputs(kind, tiny_model_factory,
                                                               tmp_path):
    path, _ = tiny_model_factory(kind)
    report = run_tp2(Scenario(path, {}, compile_sizes=[8], token_counts=(8, 14)), str(tmp_path))
    graphs = 2  # the dynamic graph and the 8-token one, each cut into pieces at attention
    # Per forward: one all-reduce after the embedding (kept), two per layer (fused).
    assert _total(report, "loom.all_reduce_add_rms_norm") == graphs * 2 * LAYERS
    assert _total(report, "loom.all_reduce") == graphs * 1
    for n, rel in report["diffs"].items():
        assert rel < 1e-5, f"{n} tokens: compiled TP=2 output off eager by {rel:.2e} (relative)"


@pytest.mark.slow
def test_fusion_can_be_turned_off(tiny_model_factory, tmp_path):
    path, _ = tiny_model_factory("llama")
    report = run_tp2(Scenario(path, {"enable_all_reduce_norm_fusion": False},
                              token_counts=(6,)), str(tmp_path))
    assert all("all_reduce_norm_fusion" not in g for g in report["graphs"])
    assert sum(g["norm_decomposition"]["loom.all_reduce.default"]
               for g in report["graphs"]) == 1 + 2 * LAYERS
