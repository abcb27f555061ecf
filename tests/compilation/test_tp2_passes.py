"""Sequence parallelism and async TP on tiny models at TP=2 on the CPU (gloo, float32).

Expected collective counts, for the tiny models' 2 layers: one all_reduce after the
embedding and two per layer (attention, MLP/MoE) = 5 sites, each becoming one
reduce_scatter and one all_gather. Async TP then fuses every gather that feeds a matmul
(all but the final norm's: 2 per layer) and every reduce_scatter of a matmul (o_proj and
down_proj; not the embedding's, nor the MoE expert block's).
"""

from __future__ import annotations

import random
import re

import pytest
import torch

from loom import LLM, SamplingParams
from tests.compilation.tp2_harness import Scenario, run_tp2

LAYERS = 2
SITES = 1 + 2 * LAYERS
# (fused all_gather+mm, fused mm+reduce_scatter, all_gather left, reduce_scatter left)
FUSED = {"llama": (2 * LAYERS, 2 * LAYERS, 1, 1),
         "granite": (2 * LAYERS, 2 * LAYERS, 1, 1),  # its residual multiplier folded
         "qwen3_moe": (2 * LAYERS, 2 * LAYERS - 1, 1, 2)}  # layer 0 is MoE, layer 1 dense


def _after(graph: dict, pass_name: str) -> tuple[int, ...]:
    counts = graph[pass_name]
    return tuple(counts[f"{op}.default"] for op in (
        "loom.all_reduce", "loom.reduce_scatter", "loom.all_gather",
        "symm_mem.fused_all_gather_matmul", "loom.matmul_reduce_scatter_partials"))


# 8 tokens: the static graph (compile_sizes); 14 tokens: the dynamic graph.
SCENARIOS = {
    # symm_mem, fused from 1 token up by the override: 14 tokens sequence-parallel, unfused.
    **{("symm_mem", kind): (kind, {"enable_async_tp": True}, (8, 14),
                            {"LOOM_ASYNC_TP_MIN_TOKENS": "1", "LOOM_ASYNC_TP_IMPL": "symm_mem"})
       for kind in ("llama", "qwen3_moe", "granite")},
    # The tiny Qwen3-MoE has a dense layer beside its MoE one: it covers Llama's sites too.
    ("overlap", "qwen3_moe"): ("qwen3_moe", {"enable_async_tp": True}, (8, 14),
                               {"LOOM_ASYNC_TP_IMPL": "overlap",
                                "LOOM_ASYNC_TP_MIN_TOKENS": "10"}),
    ("p2p", "qwen3_moe"): ("qwen3_moe", {"enable_async_tp": True}, (8, 14),
                           {"LOOM_ASYNC_TP_IMPL": "p2p", "LOOM_ASYNC_TP_MIN_TOKENS": "1"}),
    # The all-reduce + norm fusion alone (no sequence parallelism): 14 tokens take the
    # general graph's small-batch compile, 80 its other one.
    ("fusion", "qwen3_moe"): ("qwen3_moe", {}, (8, 14, 80), {}),
}


@pytest.fixture(scope="module")
def reports(tiny_model_factory, tmp_path_factory) -> dict:
    """Every scenario's report, from one pair of TP=2 processes."""
    keys = list(SCENARIOS)
    scenarios = [Scenario(tiny_model_factory(kind)[0], passes, compile_sizes=[8],
                          token_counts=counts, env=env)
                 for kind, passes, counts, env in SCENARIOS.values()]
    return dict(zip(keys, run_tp2(scenarios, str(tmp_path_factory.mktemp("tp2")))))


def _outputs_kept(report: dict) -> None:
    for n, rel in report["diffs"].items():
        assert rel < 1e-5, f"{n} tokens: compiled TP=2 output off eager by {rel:.2e} (relative)"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "qwen3_moe", "granite"])
def test_passes_rewrite_the_traced_graphs_and_keep_outputs(kind, reports):
    report = reports["symm_mem", kind]
    dynamic, static = report["graphs"]
    for graph in (dynamic, static):
        assert _after(graph, "noop_elimination") == (SITES, 0, 0, 0, 0)
        assert _after(graph, "sequence_parallelism") == (0, SITES, SITES, 0, 0)
    assert _after(dynamic, "norm_decomposition") == (0, SITES, SITES, 0, 0)
    fused_ag, fused_rs, ag_left, rs_left = FUSED[kind]
    assert _after(static, "norm_decomposition") == (0, rs_left, ag_left, fused_ag, fused_rs)
    _outputs_kept(report)


@pytest.mark.slow
def test_overlap_ops_rewrite_every_graph_and_keep_outputs(reports):
    """LOOM_ASYNC_TP_IMPL=overlap: loom's own collective matmuls (real gloo collectives on
    the CPU, no stand-in kernels) replace the same sites in the dynamic graph as well as
    the static one, and compute what eager TP=2 does in both of their run-time branches:
    from 10 tokens up, the 8-token batch takes the plain collective and one matmul, the
    14-token one the overlapped loop."""
    report = reports["overlap", "qwen3_moe"]
    fused_ag, fused_rs, ag_left, rs_left = FUSED["qwen3_moe"]
    for graph in report["graphs"]:
        counts = graph["norm_decomposition"]
        assert counts["loom.all_gather_matmul.default"] == fused_ag
        assert counts["loom.matmul_reduce_scatter.default"] == fused_rs
        assert counts["loom.all_gather.default"] == ag_left
        assert counts["loom.reduce_scatter.default"] == rs_left
        assert counts["symm_mem.fused_all_gather_matmul.default"] == 0
    _outputs_kept(report)


@pytest.mark.slow
def test_p2p_ops_rewrite_the_static_sites_and_keep_outputs(reports):
    """LOOM_ASYNC_TP_IMPL=p2p: loom's TP=2 ops over symmetric memory take the static sites
    of PyTorch's fused ops (the MoE block reading the gathered A too); on the CPU they run
    their unpipelined fallback through gloo and compute what eager TP=2 does."""
    dynamic, static = reports["p2p", "qwen3_moe"]["graphs"]
    fused_ag, fused_rs, ag_left, rs_left = FUSED["qwen3_moe"]
    counts = static["norm_decomposition"]
    assert counts["loom.all_gather_matmul_p2p.default"] == fused_ag
    assert counts["loom.matmul_reduce_scatter_partials_p2p.default"] == fused_rs
    assert (counts["loom.all_gather.default"], counts["loom.reduce_scatter.default"]) == \
        (ag_left, rs_left)
    assert counts["symm_mem.fused_all_gather_matmul.default"] == 0
    assert dynamic["norm_decomposition"]["loom.all_gather_matmul_p2p.default"] == 0
    _outputs_kept(reports["p2p", "qwen3_moe"])


@pytest.mark.slow
def test_all_reduce_norm_fusion_rewrites_every_residual_site_and_keeps_outputs(reports):
    """In the graphs for batches up to 64 tokens (the static 8-token graph, and the general
    graph's second compile for small batches) every all_reduce -> residual add -> RMSNorm
    site becomes one `loom::all_reduce_add_rms_norm` node and the embedding's all-reduce
    stays; the general graph for larger batches keeps them all."""
    report = reports["fusion", "qwen3_moe"]

    def total(op: str) -> int:
        return sum(g["all_reduce_norm_fusion"][f"{op}.default"] for g in report["graphs"])
    # Per forward: one all-reduce after the embedding (kept), two per layer (fused in the
    # static graph and the small-batch general graph, kept in the other general graph).
    assert total("loom.all_reduce_add_rms_norm") == 2 * 2 * LAYERS
    assert total("loom.all_reduce") == 1 + 1 + (1 + 2 * LAYERS)
    _outputs_kept(report)


PROMPTS = [[random.Random(i).randrange(3, 256) for _ in range(n)]
           for i, n in enumerate((7, 30, 19))]


def _generate(path: str, tp: int, **kwargs):
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              tensor_parallel_size=tp, max_num_batched_tokens=24, max_logprobs=-1, **kwargs)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=256)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        llm.shutdown()
    logprobs = torch.tensor([[o.outputs[0].logprobs[0][t].logprob for t in range(256)]
                             for o in outs])
    return [o.outputs[0].token_ids for o in outs], logprobs


REWRITE_LOGS = {
    "symm_mem": r"rank(\d) .*async_tp: 24 tokens: fused 4 of 4 all_gather\+matmul, "
                r"4 of 4 matmul\+reduce_scatter",
    "p2p": r"rank(\d) .*async_tp: 24 tokens: fused 4 of 4 all_gather\+matmul, "
           r"4 of 4 matmul\+reduce_scatter",
    "overlap": r"rank(\d) .*async_tp: loom overlap ops: rewrote 4 of 4 all_gather\+matmul, "
               r"4 of 4 matmul\+reduce_scatter",
}


def _tp2_async_tp_equals_tp1(path: str, monkeypatch) -> None:
    """TP=2 with async TP through the engine gives TP=1's tokens and logprobs."""
    # A cached compiled graph skips the passes and their log lines: compile for real.
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    tokens1, logprobs1 = _generate(path, 1)
    config = {"level": 3, "pass_config": {"enable_async_tp": True}}
    tokens2, logprobs2 = _generate(path, 2, compilation_config=config)
    assert tokens2 == tokens1
    torch.testing.assert_close(logprobs2, logprobs1, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_engine_with_async_tp_equals_tp1_eager(tiny_model_factory, capfd, monkeypatch):
    """Through the model runner: odd batches are padded to a multiple of 2 (prompts of 7,
    30 and 19 tokens in chunks of 24, decodes of 3) and the dynamic graph is rewritten."""
    _tp2_async_tp_equals_tp1(tiny_model_factory("llama")[0], monkeypatch)
    log = capfd.readouterr().err
    # One line per compiled graph: the dynamic one, and Dynamo's own for a single row of 2.
    rewrites = re.findall(r"rank(\d) .*sequence_parallelism: rewrote (\d+) of (\d+)", log)
    assert {rank for rank, _, _ in rewrites} == {"0", "1"}
    assert all((n, m) == ("5", "5") for _, n, m in rewrites), rewrites
    assert len(re.findall(r"async_tp: dynamic token count: kept 4 all_gather\+matmul and 4 "
                          r"matmul\+reduce_scatter unfused", log)) == 2


@pytest.mark.slow
def test_engine_with_overlap_ops_equals_tp1_eager(tiny_model_factory, capfd, monkeypatch):
    """Through the model runner and its async scheduling: 24-token prefill chunks overlap
    (from 16 up), decode batches take the plain branch; tokens and logprobs are TP=1's."""
    monkeypatch.setenv("LOOM_ASYNC_TP_IMPL", "overlap")
    monkeypatch.setenv("LOOM_ASYNC_TP_MIN_TOKENS", "16")
    _tp2_async_tp_equals_tp1(tiny_model_factory("llama")[0], monkeypatch)
    assert set(re.findall(REWRITE_LOGS["overlap"], capfd.readouterr().err)) == {"0", "1"}


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("impl", list(REWRITE_LOGS))
def test_collective_matmuls_on_gpu(impl, tiny_model_factory, capfd, monkeypatch):
    """The real kernels on NCCL: 24-token prefill chunks run every collective matmul fused
    (forced from 16 tokens up): symm_mem's in the static graph; p2p's there too, and
    PyTorch's in the decode graph of 24 (captured: p2p picks its slot on the host); loom's
    overlap ops in the static and the dynamic graph, decode batches taking their plain
    branch in CUDA graphs."""
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    monkeypatch.setenv("LOOM_ASYNC_TP_IMPL", impl)
    monkeypatch.setenv("LOOM_ASYNC_TP_MIN_TOKENS", "16")
    path, _ = tiny_model_factory("llama")
    results = []
    for tp, config in ((1, None), (2, {"level": 3, "compile_sizes": [24],
                                       "pass_config": {"enable_async_tp": True}})):
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cuda",
                  max_model_len=128, tensor_parallel_size=tp, max_num_batched_tokens=24,
                  kv_cache_memory_bytes=1 << 28, compilation_config=config)
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        results.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS, params,
                                                                     use_tqdm=False)])
        llm.shutdown()
    assert results[0] == results[1]
    # Every rank rewrote every site (a piece may be compiled more than once per rank).
    assert set(re.findall(REWRITE_LOGS[impl], capfd.readouterr().err)) == {"0", "1"}
