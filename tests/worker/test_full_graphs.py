"""cudagraph_mode FULL on the CPU: mixed and prefill batches replay whole-forward graphs
whose attention metadata is fixed-shape, and give eager's tokens.

A CUDA graph's contract, played by a stand-in: capturing records the forward call and its
forward context; a replay runs it again on the same static buffers (whatever the runner
copied into them since) and writes the results into the captured output. The torch
reference backend reads a fixed-shape batch from its device tensors, as the Triton kernel
does; the Triton backend's packed launch itself is checked in
tests/kernels/test_paged_attention.py.
"""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch

from loom import LLM, SamplingParams
from loom.forward_context import forward_context, get_forward_context
from loom.worker import cuda_graph, model_runner
from tests.e2e.test_correctness import _prompts


class _Graph:
    recording: list[_Graph] = []
    made: list[_Graph] = []

    def __init__(self) -> None:
        self.calls, self.replays = [], 0
        _Graph.made.append(self)

    def replay(self) -> None:
        self.replays += 1
        for forward, ctx, args, out in self.calls:
            with forward_context(ctx):
                out.copy_(forward(*args))


@contextlib.contextmanager
def _capturing(graph, pool=None):
    _Graph.recording.append(graph)
    try:
        yield
    finally:
        _Graph.recording.pop()


class _Runner(cuda_graph.CUDAGraphRunner):
    def __init__(self, forward, *args, **kwargs):
        def recorded(*inputs):
            out = forward(*inputs)
            if _Graph.recording:
                _Graph.recording[-1].calls.append((forward, get_forward_context(), inputs, out))
            return out
        super().__init__(recorded, *args, **kwargs)


def _run(path: str, mode: str):
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              max_num_batched_tokens=16, max_num_seqs=8,
              compilation_config={"level": 0, "cudagraph_mode": mode})
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(_prompts(3, (8, 21, 5)), params,
                                                         use_tqdm=False)], llm


@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_full_mode_replays_mixed_batches_with_eager_tokens(kind, tiny_model_factory, caplog,
                                                           monkeypatch):
    """Prompts of 8, 21 and 5 tokens in steps of at most 16: chunks beside decodes, and the
    last decodes alone. Every step replays a graph (mixed ones padded to 8 or 16 tokens,
    with the requests past the batch's empty), and the tokens are eager's."""
    path, _ = tiny_model_factory(kind)
    eager, _ = _run(path, "NONE")
    monkeypatch.setattr(model_runner, "cuda_graphs_on", lambda device: True)
    monkeypatch.setattr(model_runner.ModelRunner, "decode_graph_sizes",
                        lambda self: [1, 2, 4, 8, 16])
    monkeypatch.setattr(model_runner, "CUDAGraphRunner", _Runner)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "graph", _capturing)
    _Graph.made = []
    caplog.set_level(logging.INFO, logger="loom")
    steps = []
    run_mixed = cuda_graph.CUDAGraphRunner.run_mixed
    monkeypatch.setattr(cuda_graph.CUDAGraphRunner, "run_mixed", lambda self, batch, size: (
        steps.append((batch.attn_metadata.num_actual_tokens, batch.attn_metadata.num_reqs,
                      size)), run_mixed(self, batch, size))[1])
    tokens, llm = _run(path, "FULL")
    assert tokens == eager
    runner = llm.engine.executor.worker.model_runner.graph_runner
    assert sorted(runner.mixed_graphs) == [8, 16] and sorted(runner.graphs) == [1, 2, 4, 8, 16]
    assert "captured 5 CUDA graphs (decode batch sizes 1..16) and 2 of mixed batches (8..16 " \
        "tokens)" in caplog.text
    assert "cudagraph_mode FULL: batches of up to the largest capture size replay " \
           "whole-forward CUDA graphs, mixed and prefill batches too (padded to [8, 16] " \
           "tokens)" in caplog.text
    assert "(here level 0); batches of more tokens replay no CUDA graphs" in caplog.text
    # 34 prompt tokens in steps of 16: three steps with prompt chunks, each one graph
    assert len(steps) >= 3 and all(size in (8, 16) and tokens <= size and reqs <= 8
                                   for tokens, reqs, size in steps)
    assert any(tokens < size for tokens, _, size in steps)  # padding rows
    mixed = [runner.mixed_graphs[s][0] for s in (8, 16)]
    assert sum(g.replays for g in mixed) == len(steps)
    assert sum(g.replays for g, _ in runner.graphs.values()) > 0  # the decodes after


def test_other_modes_capture_no_mixed_graphs(tiny_model_factory, monkeypatch):
    path, _ = tiny_model_factory("llama")
    monkeypatch.setattr(model_runner, "cuda_graphs_on", lambda device: True)
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              compilation_config={"level": 0, "cudagraph_mode": "FULL_AND_PIECEWISE"})
    runner = llm.engine.executor.worker.model_runner
    assert runner.mixed_graph_sizes([1, 2, 4, 8, 16]) == []
    assert cuda_graph.mixed_sizes([8, 16, 32, 64], [1, 2, 4, 8, 16]) == [8, 16]
    assert cuda_graph.mixed_sizes([8, 16, 32, 64], [1, 20]) == [8, 16, 32]  # holds 20
    assert cuda_graph.mixed_sizes([8, 16, 32], [1, 2, 100]) == [8, 16, 32]
    assert cuda_graph.mixed_sizes([8, 16], []) == []
    # With drafts (k = 3), FULL_AND_PIECEWISE's verify steps: 4 tokens a request
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              speculative_config=spec, compilation_config={"level": 0})
    runner = llm.engine.executor.worker.model_runner
    assert runner.verify_query == 4
    assert runner.mixed_graph_sizes([1, 2, 4]) == [8, 16]
    assert runner.mixed_graph_sizes([1, 2, 4, 512]) == cuda_graph.piecewise_sizes(512)
    assert runner.mixed_graph_sizes([]) == []


def test_mixed_graphs_hold_what_fits(tiny_model_factory):
    """A batch replays the smallest mixed graph of at least its tokens, with no more
    requests than that graph holds, and only where the backend loses nothing there."""
    from types import SimpleNamespace

    from loom.attention.torch_native import TorchNativeBackend
    from tests.kernels.test_paged_attention import make_batch

    class Picky(TorchNativeBackend):
        fits = True

        def fits_one_launch(self, meta):
            return self.fits
    backend = Picky()
    runner = cuda_graph.CUDAGraphRunner(None, backend, [], [1, 2, 4], 8, 128,
                                        torch.device("cpu"), [8, 16, 32], max_num_seqs=10)
    assert [runner.mixed_reqs(s) for s in (8, 16, 32)] == [8, 10, 10]

    def size(q_lens, s_lens):
        return runner.mixed_size(SimpleNamespace(attn_metadata=make_batch(
            q_lens, s_lens, 2, 1, 64, 16).meta))
    assert size([5, 3], [5, 3]) == 8
    assert size([9, 1], [9, 30]) == 16
    assert size([30, 1, 1], [30, 5, 5]) == 32
    assert size([33], [33]) is None  # more tokens than any graph
    assert size([1] * 9, [3] * 9) == 16  # 9 requests: more than the 8-token graph holds
    assert size([1] * 11 + [5], [3] * 11 + [5]) is None  # more than max_num_seqs
    assert size([5], [200]) is None  # a block table wider than the graph's
    assert runner._mixed_metadata(16).max_query_len == 16
    runner.max_query = 4  # FULL_AND_PIECEWISE's verify graphs (k = 3)
    assert size([4, 4, 1], [9, 30, 5]) == 16 and size([5, 3], [5, 3]) is None
    # ... whose attention is told its queries' bound, not the graph's tokens
    assert runner._mixed_metadata(16).max_query_len == 4
    runner.max_query = None
    backend.fits = False
    assert size([5, 3], [5, 3]) is None
