"""The all-reduce + norm fusion pass at TP=2 on the CPU (gloo, float32): in the graphs for
batches up to 64 tokens (a static 8-token graph, and the general graph's second compile
for small batches) every all_reduce -> residual add -> RMSNorm site of a tiny model becomes
one `loom::all_reduce_add_rms_norm` node and the embedding's all-reduce stays; the general
graph for larger batches keeps them all; and the compiled TP=2 forward equals the eager
one on every path."""

from __future__ import annotations

import pytest

from tests.compilation.tp2_harness import Scenario, run_tp2

LAYERS = 2


def _total(report: dict, op: str) -> int:
    return sum(g["all_reduce_norm_fusion"][f"{op}.default"] for g in report["graphs"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen3_moe"])  # its layers: one dense, one MoE
def test_fusion_rewrites_every_residual_site_and_keeps_outputs(kind, tiny_model_factory,
                                                               tmp_path):
    path, _ = tiny_model_factory(kind)
    # 8: the static graph; 14: the general graph's small-batch compile; 80: its other one.
    report = run_tp2(Scenario(path, {}, compile_sizes=[8], token_counts=(8, 14, 80)),
                     str(tmp_path))
    # Per forward: one all-reduce after the embedding (kept), two per layer (fused in the
    # static graph and the small-batch general graph, kept in the other general graph).
    assert _total(report, "loom.all_reduce_add_rms_norm") == 2 * 2 * LAYERS
    assert _total(report, "loom.all_reduce") == 1 + 1 + (1 + 2 * LAYERS)
    for n, rel in report["diffs"].items():
        assert rel < 1e-5, f"{n} tokens: compiled TP=2 output off eager by {rel:.2e} (relative)"


def test_fusion_is_on_with_tp_and_can_be_turned_off():
    from loom.compilation.pass_manager import PassManager
    from loom.config import PassConfig
    names = lambda m: [p.name for p in m.passes]  # noqa: E731
    on = PassManager(PassConfig(), 2)
    assert "all_reduce_norm_fusion" in names(on) and on.range_split == 64
    assert "all_reduce_norm_fusion" not in names(PassManager(PassConfig(), 1))
    off = PassManager(PassConfig(enable_all_reduce_norm_fusion=False), 2)
    assert "all_reduce_norm_fusion" not in names(off) and off.range_split is None
    # The small-batch compile has its own cache key: a graph compiled without the fusion
    # is never served for it.
    plain = on.uuid()
    with on.small_range():
        assert on.uuid() != plain
    assert on.uuid() == plain


# The engine check (TP=2 through the model runner at level 3 gives TP=1's tokens and logprobs,
# the fusion's log lines on both ranks) runs with the decode GEMV beside it, as on a GPU:
# tests/compilation/test_decode_gemv_pass.py::test_tp2_decode_with_the_gemv_equals_tp1.
