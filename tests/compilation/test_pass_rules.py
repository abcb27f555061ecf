"""The passes' rules on small synthetic graphs (one process, no collectives run): what
sequence parallelism rewrites and what it refuses, the async-TP choice table, the cache
key, and the model runner's padding. The real models at TP=2 are in test_tp2_passes.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

import loom.distributed.ops  # noqa: F401  (registers torch.ops.loom collectives)
import loom.layers.norm  # noqa: F401  (registers torch.ops.loom norms)
from loom.compilation.pass_manager import PassManager
from loom.compilation.passes import async_tp_table
from loom.compilation.passes.sequence_parallelism import SequenceParallelismPass
from loom.config import PassConfig

H, EPS = 16, 1e-6
ops = torch.ops.loom


def _decoder(emb, o_partial, mlp_partial, w, bias=None):
    """embedding all_reduce -> norm, one layer's two residual sites, the final norm."""
    e = ops.all_reduce(emb, "tp")
    h = ops.rms_norm(e, w, EPS)
    a = ops.all_reduce(o_partial * h, "tp")
    if bias is not None:  # a bias added after the reduce: that site cannot be matched
        a = a + bias
    h, r = ops.fused_add_rms_norm(a, e, w, EPS)
    b = ops.all_reduce(mlp_partial * h, "tp")
    h, r = ops.fused_add_rms_norm(b, r, w, EPS)
    c = ops.all_reduce(mlp_partial * h, "tp")
    h, _ = ops.fused_add_rms_norm(c, r, w, EPS)
    return h


def _clean_decoder(emb, o_partial, mlp_partial, w):
    return _decoder(emb, o_partial, mlp_partial, w)


def _counts(gm) -> dict[str, int]:
    names = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    return {k: names.count(f"loom.{k}.default") for k in ("all_reduce", "reduce_scatter",
                                                           "all_gather")}


def _trace(fn, tokens: int = 8, mode: str = "fake", *extra):
    args = [torch.randn(tokens, H) for _ in range(3)] + [torch.randn(H)] + list(extra)
    return make_fx(fn, tracing_mode=mode)(*args)


def test_rewrites_every_site_and_keeps_the_residual_sharded(caplog):
    gm = _trace(_clean_decoder)
    with caplog.at_level(logging.INFO):
        assert SequenceParallelismPass(2)(gm.graph) == 4
    gm.graph.lint()
    assert _counts(gm) == {"all_reduce": 0, "reduce_scatter": 4, "all_gather": 4}
    assert "sequence_parallelism: rewrote 4 of 4 all_reduce+rms_norm" in caplog.text
    for node in gm.graph.nodes:  # every norm now runs on 8 / 2 tokens
        if "rms_norm" in str(node.target):
            assert node.args[0].meta["val"].shape[0] == 4
            assert node.args[1].meta["val"].shape[0] in (4, H)  # residual shard, or weight


def test_one_unmatchable_site_leaves_all_unrewritten(caplog):
    gm = _trace(_decoder, 8, "fake", torch.randn(H))
    with caplog.at_level(logging.WARNING):
        assert SequenceParallelismPass(2)(gm.graph) == 0
    assert _counts(gm) == {"all_reduce": 4, "reduce_scatter": 0, "all_gather": 0}
    assert "rewrote 0 of 4 all_reduce+rms_norm" in caplog.text
    assert "feeds 0 norms" in caplog.text


def test_residual_from_outside_the_graph_is_refused(caplog):
    def piece(o_partial, residual, w):  # a piece boundary cuts the residual stream
        return ops.fused_add_rms_norm(ops.all_reduce(o_partial, "tp"), residual, w, EPS)
    gm = make_fx(piece, tracing_mode="fake")(torch.randn(8, H), torch.randn(8, H),
                                            torch.randn(H))
    with caplog.at_level(logging.WARNING):
        assert SequenceParallelismPass(2)(gm.graph) == 0
    assert _counts(gm)["all_reduce"] == 1
    assert "that no rewritten norm produced" in caplog.text


@pytest.mark.parametrize("tokens", [7, None], ids=["odd-static", "symbolic-unknown"])
def test_token_count_must_be_a_known_multiple(tokens, caplog):
    gm = _trace(_clean_decoder, tokens or 8, "fake" if tokens else "symbolic")
    with caplog.at_level(logging.WARNING):
        assert SequenceParallelismPass(2)(gm.graph) == 0
    assert _counts(gm)["all_reduce"] == 4
    assert "multiple of TP size 2" in caplog.text


def test_symbolic_token_count_given_as_rows_of_tp_is_split_exactly():
    """CompiledForward hands the graph [n / 2, 2] token rows: n = 2 * s, so a shard is s."""
    def rows(emb, o_partial, mlp_partial, w):
        return _clean_decoder(*(x.flatten(0, 1) for x in (emb, o_partial, mlp_partial)), w)
    mode = FakeTensorMode(shape_env=ShapeEnv())
    rows_dynamic = StatelessSymbolicContext(
        dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC, DimDynamic.STATIC])
    args = [mode.from_tensor(torch.randn(4, 2, H), symbolic_context=rows_dynamic)
            for _ in range(3)] + [mode.from_tensor(torch.randn(H))]
    with mode:
        gm = make_fx(rows, tracing_mode="real")(*args)
    assert SequenceParallelismPass(2)(gm.graph) == 4
    s = next(n for n in gm.graph.nodes if n.op == "placeholder").meta["val"].shape[0]
    for node in gm.graph.nodes:
        if str(node.target) == "loom.reduce_scatter.default":
            assert str(node.meta["val"].shape[0]) == str(s)
        if str(node.target) == "loom.all_gather.default":
            assert str(node.meta["val"].shape[0]) == str(2 * s)


def test_async_tp_table_keeps_unfused_where_fused_measured_slower(monkeypatch):
    monkeypatch.delenv("LOOM_ASYNC_TP_MIN_TOKENS", raising=False)
    small, mid, large = (async_tp_table.choose(2, 4096, m) for m in (4096, 8192, 16384))
    assert (small.fuse_all_gather, small.fuse_reduce_scatter) == (False, False)
    assert (mid.fuse_all_gather, mid.fuse_reduce_scatter) == (True, True)  # 0.959x of off
    assert (large.fuse_all_gather, large.fuse_reduce_scatter) == (True, True)
    unknown = async_tp_table.choose(4, 8192, 16384)
    assert "no measured row for TP=4 hidden=8192" in unknown.reason
    monkeypatch.setenv("LOOM_ASYNC_TP_MIN_TOKENS", "16")
    forced = async_tp_table.choose(2, 4096, 16)
    assert forced.fuse_all_gather and forced.fuse_reduce_scatter
    assert "LOOM_ASYNC_TP_MIN_TOKENS=16" in forced.reason


def test_sequence_parallelism_only_where_measured_faster(monkeypatch):
    monkeypatch.delenv("LOOM_SP_MIN_TOKENS", raising=False)
    row = async_tp_table.MEASURED[(2, 4096)]
    choose = async_tp_table.sequence_parallel
    assert not choose(2, 4096, 2048).apply  # 1.53x slower there
    assert choose(2, 4096, row.sequence_parallelism).apply
    assert choose(2, 4096, None).apply is row.dynamic_graph
    monkeypatch.setenv("LOOM_SP_MIN_TOKENS", "4")
    assert choose(2, 4096, 4).apply and choose(2, 4096, None).apply
    assert not choose(2, 4096, 2).apply


def test_pass_keeps_the_all_reduces_of_a_graph_the_table_leaves_out(monkeypatch, caplog):
    monkeypatch.delenv("LOOM_SP_MIN_TOKENS", raising=False)
    H = 4096
    args = [torch.randn(8, H), torch.randn(8, H), torch.randn(8, H), torch.randn(H)]
    gm = make_fx(_clean_decoder)(*args)
    before = str(gm.graph)
    with caplog.at_level(logging.INFO, logger="loom.compilation.passes.sequence_parallelism"):
        assert SequenceParallelismPass(2)(gm.graph) == 0
    assert str(gm.graph) == before
    assert "8 tokens: kept 4 all_reduce+rms_norm (table row TP=2 hidden=4096" in caplog.text


@pytest.mark.parametrize("sizes, static, dynamic", [
    ([2048], set(), False),           # below the measured crossover: compiled as if off
    ([2048, 8192], {8192}, False),    # the 8192 graph only; the forward becomes one graph
    ([8191], set(), False),           # not a multiple of the TP size
])
def test_plan_says_which_graphs_take_sequence_parallelism(monkeypatch, sizes, static, dynamic):
    monkeypatch.delenv("LOOM_SP_MIN_TOKENS", raising=False)
    manager = PassManager(PassConfig(enable_async_tp=True), 2)
    plan = manager.plan(sizes, 4096)
    assert (set(plan.static_sizes), plan.dynamic, plan.any) == (static, dynamic, bool(static))
    assert manager.sp_plan is plan
    assert not PassManager(PassConfig(), 2).plan(sizes, 4096).any  # SP not enabled


def test_no_sequence_parallel_graph_compiles_like_passes_off(monkeypatch, caplog):
    """-O '{"level":3,"compile_sizes":[2048],"pass_config":{"enable_async_tp":true}}' at
    TP=2 and width 4096: split at attention and unpadded, exactly as with the passes off."""
    from loom.compilation.backend import DEFAULT_SPLITTING_OPS, CompiledForward, PiecewiseBackend
    from loom.config import CompilationConfig
    monkeypatch.delenv("LOOM_SP_MIN_TOKENS", raising=False)
    model = torch.nn.Linear(2, 2)
    model.arch = type("Arch", (), {"hidden_size": 4096})()  # what CompiledForward reads
    config = CompilationConfig.parse(
        '{"level": 3, "compile_sizes": [2048], "pass_config": {"enable_async_tp": true}}')
    with caplog.at_level(logging.INFO, logger="loom.compilation.backend"):
        compiled = CompiledForward(model, config, enforce_eager=False, tp_size=2)
    assert compiled.token_multiple == 1
    assert "sequence parallelism applies to no graph of this config" in caplog.text
    backend = PiecewiseBackend(config, compiled.pass_manager)
    assert backend.splitting_ops == DEFAULT_SPLITTING_OPS


def test_pass_config_is_part_of_the_cache_key(monkeypatch):
    monkeypatch.delenv("LOOM_ASYNC_TP_MIN_TOKENS", raising=False)
    keys = [PassManager(PassConfig(**kw), tp).uuid() for kw, tp in [
        ({}, 2), ({"enable_sequence_parallelism": True}, 2), ({"enable_async_tp": True}, 2),
        ({"enable_async_tp": True}, 4), ({"enable_noop": False}, 2)]]
    assert len(set(keys)) == len(keys)
    assert PassManager(PassConfig(enable_async_tp=True), 2).uuid() == keys[2]  # deterministic
    monkeypatch.setenv("LOOM_ASYNC_TP_MIN_TOKENS", "1")
    assert PassManager(PassConfig(enable_async_tp=True), 2).uuid() != keys[2]


def test_passes_need_level_3():
    from loom.config import CompilationConfig
    with pytest.raises(ValueError, match="level-3 passes"):
        CompilationConfig.parse('{"level": 2, "pass_config": {"enable_async_tp": true}}')
    config = CompilationConfig.parse('{"level": 3, "pass_config": {"enable_async_tp": true}}')
    assert config.pass_config.enable_sequence_parallelism


def test_batch_padded_to_a_multiple_with_dropped_rows():
    from loom.sampling_params import SamplingParams
    from loom.worker.input_batch import CachedRequestState, RequestStates, build_batch
    states = RequestStates(max_reqs=4, max_model_len=64, block_size=16)
    reqs = [CachedRequestState(str(i), list(range(3, 3 + n)), n, SamplingParams(), [i], None)
            for i, n in enumerate((3, 2))]
    for r in reqs:
        states.add(r)
    batch = build_batch(states, reqs, [3, 2], 16, torch.device("cpu"), token_multiple=4)
    assert batch.input_ids.shape[0] == batch.positions.shape[0] == 8
    meta = batch.attn_metadata
    assert meta.num_actual_tokens == 5
    assert meta.slot_mapping.tolist()[5:] == [-1, -1, -1]
    assert meta.slot_mapping.tolist()[:5] == [0, 1, 2, 16, 17]
    np.testing.assert_array_equal(batch.logits_indices.numpy(), [2, 4])
