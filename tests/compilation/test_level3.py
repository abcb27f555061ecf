"""Level-3 compilation on the CPU: the piecewise-compiled forward computes what eager does."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from loom import LLM, SamplingParams, library
from loom.compilation import backend, piece_graph
from loom.layers import attention as attention_layer
from loom.layers.attention import attention_op
from loom.config import CompilationConfig
from loom.worker import model_runner
from loom.worker.cuda_graph import piecewise_sizes
from tests.e2e.test_correctness import _prompts


def _tokens(path: str, **kwargs):
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              max_num_batched_tokens=64, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(_prompts(3, (8, 21, 5)), params,
                                                         use_tqdm=False)]


@pytest.mark.slow
@pytest.mark.parametrize("splitting_ops", [None, []], ids=["split-at-attention", "one-graph"])
def test_level3_matches_eager(splitting_ops, tiny_model_factory, caplog, monkeypatch):
    path, _ = tiny_model_factory("llama")
    compiled_sizes, patches = [], []
    original = backend.Piece._compile
    monkeypatch.setattr(backend.Piece, "_compile", lambda self, inputs: (
        compiled_sizes.append(_size(inputs)), patches.append(self.patches),
        original(self, inputs))[2])
    # Outside compiled code attention runs its Python implementation without the
    # dispatcher: eager layers call it by name, the split graph through library._IMPLS.
    direct = {"eager": 0, "split": 0}

    def counting(where):
        def call(*args, **kwargs):
            direct[where] += 1
            return attention_op(*args, **kwargs)
        return call
    monkeypatch.setattr(attention_layer, "attention_op", counting("eager"))
    monkeypatch.setitem(library._IMPLS, "attention", counting("split"))
    eager = _tokens(path)
    assert direct["eager"] > 0 and direct["split"] == 0
    direct["eager"] = 0
    caplog.set_level(logging.INFO, logger="loom.compilation.backend")
    config = {"level": 3, "compile_sizes": [3], "splitting_ops": splitting_ops,
              "inductor_compile_config": {"fallback_random": True}}
    assert _tokens(path, compilation_config=config) == eager
    assert direct["eager"] == 0  # traced: the op, which the graph splits at
    assert (direct["split"] > 0) == (splitting_ops is None)
    assert patches and all(p["fallback_random"] is True for p in patches)
    pieces = 1 if splitting_ops == [] else 2 * 2 + 1  # two layers: attention splits each
    assert f"into {pieces} pieces" in caplog.text
    assert "compiled a piece for 3 tokens" in caplog.text  # decode steps of 3 requests


def _size(inputs) -> str:
    return next((str(x.shape[0]) for x in inputs if hasattr(x, "shape") and x.dim() > 0), "")


@pytest.mark.slow
@pytest.mark.parametrize("level", [2, 3])
def test_one_token_batches_run_the_general_graph(level, tiny_model_factory):
    """A lone request decodes one token a step: the forward traced for many tokens serves
    it (Dynamo traced once, not again for size 1) and gives eager's tokens. Qwen3: its
    per-head q/k norm reshapes by -1."""
    from torch._dynamo.utils import counters
    path, _ = tiny_model_factory("qwen3")
    prompt = _prompts(5, (9,))
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    tokens = []
    for compiled in (0, level):
        counters.clear()
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu",
                  max_model_len=128, compilation_config={"level": compiled})
        tokens.append(llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids)
    assert tokens[1] == tokens[0]
    assert counters["stats"]["unique_graphs"] == 1


def _guard(kind: str, code: list[str] | None = None) -> SimpleNamespace:
    return SimpleNamespace(guard_type=kind, orig_guard=SimpleNamespace(code_list=code))


def test_only_the_token_count_floor_is_dropped_from_the_guards():
    floor = ["L['positions'].size()[0] == L['input_ids'].size()[0]",
             "2 <= L['input_ids'].size()[0]"]
    branch = floor + ["L['input_ids'].size()[0] <= 8192"]  # a branch on the token count
    entries = [_guard("TENSOR_MATCH"), _guard("SHAPE_ENV", floor), _guard("GLOBAL_STATE"),
               _guard("SHAPE_ENV", branch), _guard("SHAPE_ENV", ["3 <= L['x'].size()[0]"]),
               _guard("SHAPE_ENV", None)]
    assert backend.keep_guards(entries) == [True, False, True, True, True, True]
    cuda = ["4096*L['input_ids'].size()[0] <= 2147483647",  # as PyTorch 2.11 writes it
            "2 <= L['input_ids'].size()[0] and L['input_ids'].size()[0] <= 2147483647",
            "2 <= L['positions'].size()[0]", floor[1] + " <= 2147483647"]
    assert backend.keep_guards([_guard("SHAPE_ENV", cuda)]) == [False]
    assert backend.keep_guards([_guard("SHAPE_ENV", cuda + ["L['x'].size()[0] <= 64"])]) \
        == [True]
    assert backend.keep_guards([_guard("SHAPE_ENV", [floor[1] + " <= 8192"])]) == [True]


def test_unknown_inductor_option_is_a_clear_error(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    with pytest.raises(ValueError, match=r"inductor_compile_config: unknown Inductor option"):
        _tokens(path, compilation_config={"level": 3,
                                          "inductor_compile_config": {"max_autotunez": True}})


class _FakeGraph(piece_graph.PieceGraph):
    """A CUDA graph's contract on the CPU: capturing records the call; a replay runs it again
    on the captured argument tensors and writes the results into the captured outputs."""
    captured: list = []
    replays = 0

    def _capture(self, fn, args, log):
        self.fn, self.num_tokens = fn, backend._num_tokens
        _FakeGraph.captured.append(self)
        return fn(*args)

    def _replay(self):
        _FakeGraph.replays += 1
        fresh = self.fn(*self.args)
        outs = self.out if isinstance(self.out, tuple | list) else (self.out,)
        for old, new in zip(outs, fresh if isinstance(fresh, tuple | list) else (fresh,)):
            old.copy_(new)


@pytest.mark.slow
@pytest.mark.parametrize("splitting_ops,in_decode_capture", [(None, False), ([], False),
                                                            (None, True)],
                         ids=["split-at-attention", "one-graph", "inside-a-decode-capture"])
def test_piecewise_graphs_replay_static_sizes_with_new_inputs(splitting_ops, in_decode_capture,
                                                             tiny_model_factory, caplog,
                                                             monkeypatch):
    """cudagraph_mode FULL_AND_PIECEWISE: each static-size piece is captured at start-up
    (its second run) and replayed after; attention's fresh outputs are copied into the captured inputs,
    so every decode step of 3 requests still computes eager's tokens. While a whole-forward
    decode graph is being captured, a piece neither captures nor replays its own graph (a
    capture inside a capture fails on CUDA): it runs its kernels into the outer graph."""
    path, _ = tiny_model_factory("llama")
    eager = _tokens(path)
    monkeypatch.setattr(model_runner, "cuda_graphs_on", lambda device: True)
    monkeypatch.setattr(piece_graph, "can_capture", lambda args: True)
    monkeypatch.setattr(piece_graph, "inside_capture", lambda: in_decode_capture)
    monkeypatch.setattr(piece_graph, "PieceGraph", _FakeGraph)
    _FakeGraph.captured, _FakeGraph.replays = [], 0
    caplog.set_level(logging.INFO, logger="loom")
    config = {"level": 3, "compile_sizes": [3], "splitting_ops": splitting_ops,
              "cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert _tokens(path, compilation_config=config) == eager
    if splitting_ops == []:
        assert not _FakeGraph.captured
        assert "piecewise CUDA graphs need level 3 with the graph split at attention (here " \
               "level 3, one whole graph)" in caplog.text
        return
    if in_decode_capture:
        assert not _FakeGraph.captured and _FakeGraph.replays == 0
        return
    # At start-up: the three pieces around two attention layers, at the compile size and at
    # each size batches are padded to.
    assert len(_FakeGraph.captured) == 3 * 5
    assert "the pieces captured at 5 sizes (3 .. 64 tokens)" in caplog.text
    # Decode steps of 3 tokens after the capture step: every piece replayed in each.
    assert _FakeGraph.replays >= 3 * 4 and _FakeGraph.replays % 3 == 0


PADDED = {  # cudagraph_mode (and capture sizes): the sizes batches are padded to
    "FULL_AND_PIECEWISE": ({}, [8, 16, 32, 64]),
    "FULL": ({}, [8, 16, 32, 64]),  # as FULL_AND_PIECEWISE: no decode graphs on the CPU
    "PIECEWISE": ({"cudagraph_capture_sizes": [4, 64]}, [4, 64]),  # the capture sizes
}


@pytest.mark.slow
@pytest.mark.parametrize("kind, mode", [("llama", "FULL_AND_PIECEWISE"),
                                        ("qwen3_moe", "FULL_AND_PIECEWISE"),  # padding rows
                                        ("llama", "FULL"), ("llama", "PIECEWISE")])  # routed
def test_piecewise_graphs_pad_other_batches_to_their_sizes(kind, mode, tiny_model_factory,
                                                           caplog, monkeypatch):
    """With no compile_sizes: a batch no decode graph takes (on the CPU, every batch) is
    padded up to a piecewise size, whose pieces were captured at start-up and are replayed.
    The padding rows must change no real token: the tokens stay eager's. PIECEWISE, as in
    vLLM, pads to cudagraph_capture_sizes where given."""
    path, _ = tiny_model_factory(kind)
    eager = _tokens(path)
    monkeypatch.setattr(model_runner, "cuda_graphs_on", lambda device: True)
    monkeypatch.setattr(piece_graph, "can_capture", lambda args: True)
    monkeypatch.setattr(piece_graph, "PieceGraph", _FakeGraph)
    _FakeGraph.captured, _FakeGraph.replays = [], 0
    rows = []
    build = model_runner.build_batch

    def recording(*args, **kwargs):
        batch = build(*args, **kwargs)
        rows.append((batch.input_ids.shape[0], batch.attn_metadata.num_actual_tokens))
        return batch
    monkeypatch.setattr(model_runner, "build_batch", recording)
    caplog.set_level(logging.INFO, logger="loom")
    extra, sizes = PADDED[mode]
    config = {"level": 3, "cudagraph_mode": mode, **extra}
    assert _tokens(path, compilation_config=config) == eager
    # Prompts of 8 + 21 + 5 tokens in one step of 34, padded to 64; then decode steps of 3,
    # padded to the next size.
    assert rows[0] == (64, 34) and len(rows) == 6
    assert all(r == (next(s for s in sizes if s >= 3), 3) for r in rows[1:])
    assert f"padded to {sizes} tokens" in caplog.text
    assert ("cudagraph_mode FULL: batches of up to the largest capture size replay whole-"
            "forward CUDA graphs, mixed and prefill batches too (none here: no decode batch size "
            "is captured)" in caplog.text) == (mode == "FULL")
    assert ("cudagraph_mode PIECEWISE: decode batches replay the pieces" in caplog.text) == \
        (mode == "PIECEWISE")
    # Every size's three pieces at start-up, each replayed once there (its capturing run),
    # then in each of the six steps.
    assert len(_FakeGraph.captured) == 3 * len(sizes)
    # Largest first, so that smaller sizes reuse the pool's blocks.
    assert [g.num_tokens for g in _FakeGraph.captured[::3]] == sizes[::-1]
    assert _FakeGraph.replays == 3 * len(sizes) + 3 * 6
    assert f"the pieces captured at {len(sizes)} sizes ({sizes[0]} .. 64 tokens)" in caplog.text


def test_piecewise_sizes_stop_at_the_first_that_holds_a_full_batch():
    assert piecewise_sizes(8192) == [8, 16, 32, 64, 128, 256, 512, 576, 640, 704, 768, 832,
                                     896, 960, 1024, 1152, 1280, 1408, 1536, 1664, 1792,
                                     1920, 2048]
    assert piecewise_sizes(600) == [8, 16, 32, 64, 128, 256, 512, 576, 640]
    assert piecewise_sizes(100) == [8, 16, 32, 64, 128]  # 128 holds a 100-token batch
    assert piecewise_sizes(64) == [8, 16, 32, 64]


def test_a_batch_pads_to_the_next_piecewise_size_unless_a_decode_graph_takes_it():
    from types import SimpleNamespace
    runner = SimpleNamespace(piece_sizes=[8, 16, 24, 32],  # 24: a compile size
                             graph_runner=SimpleNamespace(sizes=[1, 2, 4]))
    rows = lambda counts: model_runner.ModelRunner._padded_rows(runner, counts)  # noqa: E731
    assert rows([1, 1, 1]) is None  # a pure decode of 3: the decode graph of 4
    assert rows([1] * 5) == 8  # more decodes than the largest decode graph
    assert rows([15, 1, 1, 1]) == 24 and rows([24]) == 24  # a compile size is a target
    assert rows([33]) is None  # past the largest size: eager pieces
    runner.graph_runner = None
    assert rows([1, 1, 1]) == 8
    runner.piece_sizes = []
    assert rows([1, 1, 1]) is None


def test_cudagraph_mode_is_checked():
    with pytest.raises(ValueError, match=r"cudagraph_mode: must be one of"):
        CompilationConfig.parse({"level": 3, "cudagraph_mode": "PIECEWISE_PLEASE"})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tp", [1, 2])
def test_piecewise_graphs_on_gpu(tp, tiny_model_factory, capfd, caplog):
    """Real CUDA graphs: prefill chunks of 24 tokens (a static size) replay their pieces,
    the smaller mixed batches are padded to 8, 16 or 32 tokens and replay the general
    graph's pieces, NCCL all-reduces included at TP=2, and all give the greedy tokens of
    the default mode."""
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs")
    path, _ = tiny_model_factory("llama")
    caplog.set_level(logging.INFO, logger="loom.worker.warmup")  # TP=1: in-process
    prompts = _prompts(4, (70, 50, 90, 30))
    results = []
    for mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cuda",
                  max_model_len=128, tensor_parallel_size=tp, max_num_batched_tokens=24,
                  kv_cache_memory_bytes=1 << 28, enable_prefix_caching=False,
                  compilation_config={"level": 3, "compile_sizes": [24],
                                      "cudagraph_mode": mode})
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        results.append([o.outputs[0].token_ids for o in llm.generate(prompts, params,
                                                                     use_tqdm=False)])
        llm.shutdown()
    assert results[0] == results[1]
    # TP=2: the workers' log lines reach the test as stderr.
    assert "the pieces captured at 4 sizes (8 .. 32 tokens)" in \
        caplog.text + capfd.readouterr().err
