"""The all-reduce + norm fusion pass's switches. Its rewrite of a tiny model's graphs at TP=2
on the CPU runs in the same processes as the other passes' checks:
tests/compilation/test_tp2_passes.py::test_all_reduce_norm_fusion_rewrites_every_residual_site_
and_keeps_outputs."""

from __future__ import annotations


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
