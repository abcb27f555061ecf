"""Level-3 compilation on the CPU: the piecewise-compiled forward computes what eager does."""

from __future__ import annotations

import logging

import pytest

from loom import LLM, SamplingParams
from loom.compilation import backend
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
    eager = _tokens(path)
    caplog.set_level(logging.INFO, logger="loom.compilation.backend")
    config = {"level": 3, "compile_sizes": [3], "splitting_ops": splitting_ops,
              "inductor_compile_config": {"fallback_random": True}}
    assert _tokens(path, compilation_config=config) == eager
    assert patches and all(p["fallback_random"] is True for p in patches)
    pieces = 1 if splitting_ops == [] else 2 * 2 + 1  # two layers: attention splits each
    assert f"into {pieces} pieces" in caplog.text
    assert "compiled a piece for 3 tokens" in caplog.text  # decode steps of 3 requests


def _size(inputs) -> str:
    return next((str(x.shape[0]) for x in inputs if hasattr(x, "shape") and x.dim() > 0), "")


def test_unknown_inductor_option_is_a_clear_error(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    with pytest.raises(ValueError, match=r"inductor_compile_config: unknown Inductor option"):
        _tokens(path, compilation_config={"level": 3,
                                          "inductor_compile_config": {"max_autotunez": True}})
