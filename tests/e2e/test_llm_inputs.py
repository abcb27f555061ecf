"""The offline LLM's inputs as a vLLM user passes them: what cannot be honoured is refused
by name before anything runs (prompt dict keys such as multi_modal_data, boolean token ids,
truthy strings for booleans, a chat_template_kwargs that is no dict), and calls from several
threads each get their own outputs, as one thread alone gets them."""

from __future__ import annotations

import threading

import pytest
import torch

from loom import LLM, BeamSearchParams, PoolingParams, SamplingParams
from tests.conftest import hf_greedy, hf_last_logprobs

N = 6
PROMPTS = [[5, 9, 13, 2, 7], [40, 41, 42], [100, 3, 3, 3, 60, 61, 62], [8]]


@pytest.fixture(scope="module")
def tiny(tiny_llama_with_tokenizer):
    path, hf = tiny_llama_with_tokenizer
    llm = LLM(path, dtype="float32", device="cpu", max_model_len=128)
    yield llm, hf
    llm.shutdown()


def _greedy() -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=N, ignore_eos=True)


@pytest.mark.parametrize("call, message", [
    (lambda llm: llm.generate({"prompt": "x", "multi_modal_data": {"image": "y"}}),
     r"^prompts: a prompt dict takes cache_salt, prompt, prompt_token_ids .*"
     r"\['multi_modal_data'\]"),
    (lambda llm: llm.generate([[True, False, 3]]), "^prompt: must be a string or a list of token"),
    (lambda llm: llm.chat([{"role": "user", "content": "hi"}], chat_template_kwargs="abc"),
     "^chat_template_kwargs: must be a dict"),
    (lambda llm: llm.chat([{"role": "user", "content": "hi"}], chat_template_kwargs={1: 2}),
     "^chat_template_kwargs: must be a dict"),
    (lambda llm: llm.chat([{"role": "user", "content": "hi"}], chat_template="{{ 1 / 0 }}"),
     "^messages: the chat template refused them: ZeroDivisionError"),
    (lambda llm: llm.beam_search(["x"], BeamSearchParams(beam_width=2, max_tokens=2,
                                                         ignore_eos="no")), "^ignore_eos: "),
    (lambda llm: BeamSearchParams(beam_width=2, max_tokens=2, length_penalty=float("nan")),
     "^length_penalty: must be a finite number"),
    (lambda llm: PoolingParams(normalize="no"), "^normalize: must be true, false or None"),
    (lambda llm: LLM(tokenizer=123), "^tokenizer: must be a path"),
    (lambda llm: LLM(chat_template=5), "^chat_template: must be a path"),
    (lambda llm: LLM(skip_tokenizer_init="yes"), "^skip_tokenizer_init: must be true or false"),
    (lambda llm: LLM(disable_log_stats=False), "^disable_log_stats: the offline LLM logs no"),
    (lambda llm: LLM(swap_space=-1), "^swap_space: must be a non-negative number of GiB"),
    (lambda llm: llm.chat([{"role": "user", "content": "hi"}], add_generation_prompt="no"),
     "^add_generation_prompt: must be true or false"),
])
def test_what_cannot_be_honoured_is_refused_by_name(tiny, call, message):
    llm, _ = tiny
    with pytest.raises(ValueError, match=message):
        call(llm)
    assert not llm.engine.has_unfinished_requests()


def test_vllm_arguments_loom_already_honours_are_taken(tiny_llama_with_tokenizer, caplog):
    """vLLM's disable_log_stats=True (its LLM's default) and swap_space (unused by vLLM's V1
    engine, which preempts by recomputing, as loom does), as vLLM scripts pass them."""
    path, hf = tiny_llama_with_tokenizer
    with caplog.at_level("INFO", logger="loom.engine.arg_utils"):
        llm = LLM(path, dtype="float32", device="cpu", max_model_len=64,
                  disable_log_stats=True, swap_space=4)
    try:
        out = llm.generate([PROMPTS[0]], _greedy(), use_tqdm=False)[0].outputs[0].token_ids
    finally:
        llm.shutdown()
    assert out == hf_greedy(hf, PROMPTS[0], N)
    assert sum("swap_space: loom preempts by recomputing" in r.message
               for r in caplog.records) == 1


def test_calls_from_several_threads_each_get_their_own_outputs(tiny):
    """Two threads' generate calls at once: one failed inside (its step's token read by the
    other's) and the other got [] back; they now run one after the other."""
    llm, hf = tiny
    expected = [hf_greedy(hf, p, N) for p in PROMPTS]
    results: dict[int, list] = {}

    def run(i: int) -> None:
        outs = llm.generate(PROMPTS[i::2], _greedy(), use_tqdm=False)
        results[i] = [o.outputs[0].token_ids for o in outs]
    for _ in range(3):
        threads = [threading.Thread(target=run, args=(i,)) for i in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert results == {0: expected[0::2], 1: expected[1::2]}
        results.clear()


def test_logprobs_minus_one_are_the_whole_vocabulary(tiny, tiny_llama_with_tokenizer):
    """vLLM's logprobs=-1: every token's logprob, transformers' log_softmax; beyond the
    engine's max_logprobs (20 by default) it is refused in those terms."""
    llm, hf = tiny
    with pytest.raises(ValueError, match=r"^logprobs: -1 asks for the whole vocabulary "
                                         r"\(\d+ tokens\), more than the engine's max_logprobs"):
        llm.generate([PROMPTS[0]], SamplingParams(max_tokens=1, logprobs=-1))
    path, _ = tiny_llama_with_tokenizer
    every = LLM(path, dtype="float32", device="cpu", max_model_len=64, max_logprobs=-1)
    try:
        out = every.generate([PROMPTS[0]], SamplingParams(max_tokens=1, temperature=0.0,
                                                          logprobs=-1, prompt_logprobs=-1),
                             use_tqdm=False)[0]
    finally:
        every.shutdown()
    expected = hf_last_logprobs(hf, PROMPTS[0])
    first = out.outputs[0].logprobs[0]
    assert sorted(first) == list(range(expected.numel()))
    got = torch.tensor([first[t].logprob for t in range(expected.numel())])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert len(out.prompt_logprobs[1]) == expected.numel()


def test_a_shut_down_llm_refuses_every_call(tiny_llama_with_tokenizer):
    path, _ = tiny_llama_with_tokenizer
    llm = LLM(path, dtype="float32", device="cpu", max_model_len=64)
    llm.shutdown()
    for call in (llm.reset_prefix_cache, llm.start_profile, lambda: llm.generate("x")):
        with pytest.raises(RuntimeError, match="^LLM: shut down"):
            call()
