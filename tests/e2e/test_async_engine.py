"""Async scheduling end to end: the same requests with the next step launched before the
last one is read back, and without. Greedy tokens are checked against transformers; a mix
of sampling features (penalties, seeds, min_tokens, logprobs, stop tokens, early
finishes) must give identical outputs either way."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from loom import LLM, SamplingParams
from tests.conftest import hf_greedy
from tests.e2e.test_correctness import _prompts

DEVICES = ["cpu", pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def _mixed_params() -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True, repetition_penalty=1.4),
        SamplingParams(temperature=0.9, top_p=0.9, seed=11, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True),  # finishes early
        SamplingParams(temperature=0.0, max_tokens=10, min_tokens=4, logprobs=3,
                       ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[7, 8, 9, 10, 11],
                       min_tokens=3),
        SamplingParams(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True,
                       presence_penalty=1.5, frequency_penalty=0.5),
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                       repetition_penalty=3.0),
    ]


PROMPT_LENGTHS = (9, 21, 4, 30, 15, 6, 12, 18)
READS_OUTPUTS = {"1", "5", "6", "7"}
"""Requests whose sampling reads their outputs (penalties, min_tokens masking stop tokens):
they run ahead too, the worker reading their tokens in flight back before they sample."""


def _run(path: str, device: str, async_scheduling: bool, **kw):
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device=device, max_model_len=256,
              async_scheduling=async_scheduling, **kw)
    outs, ahead = run_spied(llm, _prompts(3, PROMPT_LENGTHS), _mixed_params(),
                            2 if async_scheduling else 1)
    # Seeded draws need only their output count.
    assert ({"2"} | READS_OUTPUTS <= ahead) if async_scheduling else not ahead
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason,
             [sorted(d) for d in (o.outputs[0].logprobs or [])]) for o in outs]


def run_spied(llm, prompts, params, depth: int):
    """Generate (then shut the LLM down), checking that the engine kept `depth` steps in
    flight at most and at some point; also return the ids of the requests scheduled while
    a step of theirs was in flight."""
    engine, depths, ahead = llm.engine, [], set()
    launch = engine._launch

    def spy(scheduler_output):
        launch(scheduler_output)
        depths.append(len(engine._in_flight))
        ahead.update(c.req_id for c in scheduler_output.cached_reqs
                     if engine.scheduler.requests[c.req_id].num_output_placeholders > 1)

    engine._launch = spy
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        del engine._launch  # (the spy and the engine would make a cycle)
        llm.shutdown()
    assert max(depths) == depth  # steps launched before a read-back
    return outs, ahead


@pytest.mark.parametrize("device", DEVICES)
def test_async_and_sync_scheduling_give_the_same_outputs(device, tiny_model_factory):
    path, hf = tiny_model_factory("llama")
    # A small token budget splits prompts into chunks and mixes prefill with decodes.
    on = _run(path, device, True, max_num_batched_tokens=24)
    off = _run(path, device, False, max_num_batched_tokens=24)
    assert on == off
    prompts = _prompts(3, PROMPT_LENGTHS)
    assert on[0][0] == hf_greedy(hf, prompts[0], 14)
    assert on[3][0] == hf_greedy(hf, prompts[3], 3)
    if device == "cpu":  # run ahead, penalized by its whole output: transformers' tokens
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompts[7]]), max_new_tokens=12, do_sample=False,
                              min_new_tokens=12, repetition_penalty=3.0, pad_token_id=0)
        assert on[7][0] == out[0, len(prompts[7]):].tolist()


def test_nothing_keeps_the_runner_after_requests_ran_ahead(tiny_model_factory):
    """Steps read back early are held weakly: a cycle through the model runner outlives
    shutdown (start-up freezes the heap, `loom.heap.settle`), and with it the device's
    weights and KV cache; on CUDA the next LLM in the process found no room for a cache."""
    path, _ = tiny_model_factory("llama")
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=256,
              max_num_batched_tokens=24)
    runner = weakref.ref(llm.engine.executor.worker.model_runner)
    ahead = run_spied(llm, _prompts(3, PROMPT_LENGTHS), _mixed_params(), 2)[1]
    assert READS_OUTPUTS <= ahead
    del llm
    gc.collect()
    assert runner() is None
