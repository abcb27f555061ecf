"""LOOM_PAD_TOKENS: a large step runs padded to a round row count (for the GEMMs) and gives
what the unpadded step gives."""

import random

import pytest
import torch

from loom import LLM, SamplingParams
from loom.worker import model_runner

PROMPTS = [[random.Random(i).randrange(3, 256) for _ in range(n)] for i, n in enumerate((150, 151))]


def _generate(path):
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=400,
              max_num_batched_tokens=512, enforce_eager=True)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=20)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        llm.shutdown()
    logprobs = torch.tensor([[lp.logprob for lp in o.outputs[0].logprobs[0].values()]
                             for o in outs])
    return [o.outputs[0].token_ids for o in outs], logprobs


def test_a_padded_prompt_step_gives_the_unpadded_tokens(tiny_model_factory, monkeypatch):
    path, _ = tiny_model_factory("llama")
    pads = []
    real = model_runner.build_batch

    def spy(*args, **kwargs):
        pads.append(args[-1] if len(args) == 8 else kwargs.get("pad_to"))
        return real(*args, **kwargs)
    monkeypatch.setattr(model_runner, "build_batch", spy)
    monkeypatch.delenv("LOOM_PAD_TOKENS", raising=False)
    want_tokens, want_logprobs = _generate(path)
    assert pads[0] is None
    pads.clear()
    monkeypatch.setenv("LOOM_PAD_TOKENS", "4")  # steps of >= 256 tokens, to a multiple of 4
    tokens, logprobs = _generate(path)
    assert pads[0] == 304  # 150 + 151 prompt tokens in one step
    assert all(p is None for p in pads[1:])  # the decodes
    assert tokens == want_tokens
    torch.testing.assert_close(logprobs, want_logprobs, rtol=1e-5, atol=1e-5)


def test_bad_loom_pad_tokens_is_a_clear_error(monkeypatch):
    from loom import envs
    monkeypatch.setenv("LOOM_PAD_TOKENS", "0")
    with pytest.raises(ValueError, match="LOOM_PAD_TOKENS"):
        envs.pad_tokens_multiple()
