"""Custom logits processors on CUDA, under CUDA graphs and the compiled model: a targeted
request draws only its target, a counting one reads its own output ids, untouched requests
give the tokens of an engine without processors, and an argmax-invariant processor reaches
random rows (which the sampling kernel would otherwise draw from). Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from loom import LLM, SamplingParams
from tests.e2e.test_correctness import _prompts
from tests.engine.logits_procs import CountUp, TargetToken, TopOne

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _llm(path: str, **kwargs) -> LLM:
    return LLM(path, skip_tokenizer_init=True, max_model_len=256, device="cuda",
               kv_cache_memory_bytes=256 * 2**20, max_num_seqs=4, **kwargs)


def test_gpu_logits_processors(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    prompts = _prompts(7, (5, 40, 17, 90, 3, 33, 12, 60))
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = _llm(path)
    try:
        expected = [o.outputs[0].token_ids for o in plain.generate(prompts, greedy,
                                                                    use_tqdm=False)]
    finally:
        plain.shutdown()
    llm = _llm(path, logits_processors=[TargetToken, TopOne, CountUp])
    try:
        args = [{"target_token": 30 + i} if i % 3 == 0 else {"count_from": 60 + i}
                if i % 3 == 1 else None for i in range(len(prompts))]
        outs = llm.generate(prompts, [greedy.clone(extra_args=a) for a in args], use_tqdm=False)
        for a, want, out in zip(args, expected, outs):
            tokens = out.outputs[0].token_ids
            if a is None:
                assert tokens == want
            elif "target_token" in a:
                assert tokens == [a["target_token"]] * 12
            else:
                assert tokens == list(range(a["count_from"], a["count_from"] + 12))
        drawn = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
        topped = llm.generate(prompts[:2], drawn.clone(extra_args={"top_one": True}),
                              use_tqdm=False)
        assert [o.outputs[0].token_ids for o in topped] == expected[:2]
    finally:
        llm.shutdown()
