"""compilation/piece_graph.py: what a piece's graph keeps between replays. On the CPU a stand-in
graph replays by running the piece again on its static inputs; the weak aliases of the pool
are checked on the GPU (`-m gpu`), where a wrong one corrupts a later size's tokens."""

from __future__ import annotations

import logging

import pytest
import torch

from loom import LLM, SamplingParams
from loom.compilation import piece_graph


class _Rerun(piece_graph.PieceGraph):
    def _capture(self, fn, args, log):
        self.fn = fn
        return fn(*args)

    def _replay(self):
        outs = self.out if isinstance(self.out, tuple | list) else (self.out,)
        fresh = self.fn(*self.args)
        for old, new in zip(outs, fresh if isinstance(fresh, tuple | list) else (fresh,)):
            old.copy_(new)


def _piece(x, w, scale):
    return x @ w * scale, x + 1


def test_eager_inputs_share_one_slot_across_sizes_and_parameters_stay_as_given():
    w = torch.nn.Parameter(torch.randn(4, 3), requires_grad=False)
    slots = piece_graph.InputSlots(lambda: 16)
    log = piece_graph.CaptureLog()
    graphs = {}
    for n in (8, 4, 16):
        x = torch.randn(n, 4)
        graphs[n] = _Rerun(_piece, [x, w, 0.5], log, slots, n)
        first = graphs[n](x, w, 0.5)
        torch.testing.assert_close(first[0], x @ w * 0.5)
        assert graphs[n].args[1] is w and graphs[n].args[2] == 0.5
        assert graphs[n].args[0].shape == (n, 4) and graphs[n].args[0] is not x
    # One buffer of 16 rows: every size's static input starts at its first row.
    assert len({g.args[0].data_ptr() for g in graphs.values()}) == 1
    assert len(slots.buffers) == 1 and next(iter(slots.buffers.values())).shape == (16, 4)
    for n in (4, 16, 8):  # replays in another order than the captures: fresh inputs each
        x = torch.randn(n, 4)
        out, plus_one = graphs[n](x, w, 0.5)
        torch.testing.assert_close(out, x @ w * 0.5)
        torch.testing.assert_close(plus_one, x + 1)
    with pytest.raises(RuntimeError, match=r"captured with 0.5, called with 0.25"):
        graphs[4](torch.randn(4, 4), w, 0.25)


def test_a_slot_takes_only_contiguous_rows_of_the_token_count():
    slots = piece_graph.InputSlots(lambda: 8)
    assert slots.slot(0, torch.zeros(5, 2), 5).shape == (5, 2)
    assert slots.slot(1, torch.zeros(3, 2), 5) is None  # not one row per token
    assert slots.slot(2, torch.zeros(2, 5).t(), 5) is None  # not contiguous
    assert slots.slot(3, torch.tensor(1.0), 5) is None
    bigger = slots.slot(0, torch.zeros(12, 2), 12)  # past the plan: a new, larger buffer
    assert bigger.shape == (12, 2) and slots.buffers[(0, torch.float32, torch.device("cpu"),
                                                      (2,))].shape == (12, 2)


def test_the_first_call_hands_back_the_captures_own_outputs_then_the_kept_ones():
    log = piece_graph.CaptureLog()
    x = torch.randn(4, 4)
    graph = _Rerun(lambda a: (a * 2,), [x], log, piece_graph.InputSlots(lambda: 4), 4)
    captured = graph.first
    assert graph(x) is captured
    assert graph.first is None  # let go: the capturing forward frees it as it goes
    second = graph(x)
    assert second is graph.out
    torch.testing.assert_close(second[0], x * 2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_pieces_of_many_sizes_share_the_pool_and_keep_eager_tokens(tiny_model_factory, caplog):
    """Prompts of many lengths, chunked and mixed with decodes, pad to most sizes from 8 to
    256, in an order of their own; each size's pieces reuse memory that other sizes'
    captures freed. A replay writing over live data would change tokens: they must be the
    tokens of FULL_DECODE_ONLY, whose prompt steps run no piece graph; under PIECEWISE the
    decode steps replay pieces too."""
    path, _ = tiny_model_factory("llama")
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 200, (24,), generator=gen).tolist()
    prompts = [{"prompt_token_ids": torch.randint(5, 100, (n,), generator=gen).tolist()}
               for n in lengths]
    caplog.set_level(logging.INFO, logger="loom.worker.warmup")
    results = []
    for mode in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "PIECEWISE"):
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cuda",
                  max_model_len=256, max_num_batched_tokens=256, max_num_seqs=6,
                  kv_cache_memory_bytes=1 << 28, enable_prefix_caching=False,
                  compilation_config={"level": 3, "cudagraph_mode": mode})
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        runs = []
        for order in (prompts, prompts[::-1], prompts[::2]):
            runs.append([o.outputs[0].token_ids
                         for o in llm.generate(order, params, use_tqdm=False)])
        results.append(runs)
        llm.shutdown()
    assert results[0] == results[1] == results[2]
    assert "the pieces captured at 6 sizes (8 .. 256 tokens)" in caplog.text


def test_a_size_whose_captures_fail_warns_once_and_says_how_many(monkeypatch, caplog):
    class _OutOfMemory(_Rerun):
        def _capture(self, fn, args, log):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    monkeypatch.setattr(piece_graph, "PieceGraph", _OutOfMemory)
    log = piece_graph.CaptureLog()
    log.num_pieces = 3
    caplog.set_level(logging.INFO, logger="loom.compilation.piece_graph")
    with piece_graph.quiet():
        graphs = [log.capture(lambda x: x, [torch.zeros(4, 2)], 4) for _ in range(3)]
    assert graphs == [None, None, None]  # each piece then runs eagerly
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "piecewise CUDA graph for 4 tokens could not be captured (CUDA out of memory. Tried "
        "to allocate 2.00 GiB); that piece runs without one",
        "piecewise CUDA graphs for 4 tokens: 0 of 3 pieces captured, 0.00 GB more GPU memory "
        "reserved"]
