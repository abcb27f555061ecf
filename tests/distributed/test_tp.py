"""Tensor parallelism on the CPU (gloo): TP=2 computes what TP=1 computes, and a dead
worker fails the engine fast with its rank and reason."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest
import torch

from loom import LLM, SamplingParams
from loom.executor.multiproc import WorkerError

PROMPTS = [[random.Random(i).randrange(3, 256) for _ in range(n)] for i, n in enumerate((7, 30, 19))]


def _run(path: str, tp: int):
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              tensor_parallel_size=tp, max_num_batched_tokens=24, max_logprobs=-1)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=256)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        tokens = [o.outputs[0].token_ids for o in outs]
        logprobs = torch.tensor([[o.outputs[0].logprobs[0][t].logprob for t in range(256)]
                                 for o in outs])
        return tokens, logprobs
    finally:
        llm.shutdown()


@pytest.mark.parametrize("kind", ["llama", "llama_mqa", "qwen3", "qwen3_moe", "qwen2_moe", "phi3",
                                  "gemma2", "granite", "granite_moe", "smollm3"])
def test_tp2_equals_tp1(kind, tiny_model_factory):
    path, _ = tiny_model_factory(kind)
    tokens1, logprobs1 = _run(path, 1)
    tokens2, logprobs2 = _run(path, 2)
    assert tokens2 == tokens1
    torch.testing.assert_close(logprobs2, logprobs1, rtol=1e-4, atol=1e-5)


def test_tp2_async_scheduling_with_mixed_sampling_equals_tp1(tiny_model_factory):
    """Steps launched ahead on both ranks: rank 1 takes its decode inputs from the driver's
    sampled tokens (a broadcast), for greedy, seeded random, penalised and stop-token
    requests alike; those whose sampling reads their outputs run ahead too."""
    from tests.e2e.test_async_engine import (PROMPT_LENGTHS, READS_OUTPUTS, _mixed_params,
                                             run_spied)
    from tests.e2e.test_correctness import _prompts
    path, _ = tiny_model_factory("llama")
    results = []
    for tp in (1, 2):
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu",
                  max_model_len=128, tensor_parallel_size=tp, max_num_batched_tokens=24)
        # TP=2: the ranks reply a step late, so one more step is launched ahead.
        outs, ahead = run_spied(llm, _prompts(3, PROMPT_LENGTHS), _mixed_params(),
                                3 if tp == 2 else 2)
        assert READS_OUTPUTS <= ahead
        results.append([(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs])
    assert results[1] == results[0]


def test_environment_reaches_every_worker(tiny_model_factory, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    path, _ = tiny_model_factory("llama")
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", max_model_len=128, tensor_parallel_size=2)
    try:
        executor = llm.engine.executor
        assert executor.collective_rpc("get_env", "NCCL_NVLS_ENABLE") == ["0", "0"]
        assert executor.collective_rpc("get_env", "TORCH_SYMM_MEM_DISABLE_MULTICAST") == ["1", "1"]
    finally:
        llm.shutdown()


def test_killed_worker_fails_fast_with_its_rank(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    llm = LLM(path, skip_tokenizer_init=True, device="cpu", max_model_len=512, tensor_parallel_size=2)
    victim = llm.engine.executor.procs[1]
    killer = threading.Timer(1.0, lambda: os.kill(victim.pid, signal.SIGKILL))
    killer.start()
    start = time.monotonic()
    with pytest.raises(WorkerError, match="rank 1 died"):
        llm.generate([[5] * 20] * 4, SamplingParams(max_tokens=400, ignore_eos=True), use_tqdm=False)
    assert time.monotonic() - start < 15
    assert not any(p.is_alive() for p in llm.engine.executor.procs)
    llm.shutdown()


def test_worker_exception_is_reported_with_its_reason(tiny_model_factory, tmp_path):
    # A weights file cut short: every rank fails to read it.
    import shutil
    path, _ = tiny_model_factory("llama")
    broken = tmp_path / "broken"
    shutil.copytree(path, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(WorkerError, match="rank . failed: "):
        LLM(str(broken), skip_tokenizer_init=True, device="cpu", max_model_len=128,
            tensor_parallel_size=2)


def test_a_model_that_cannot_be_split_fails_before_any_worker_starts(tiny_model_factory):
    path, _ = tiny_model_factory("llama")  # 4 heads, 128 features: not splittable over 3 ranks
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"tensor_parallel_size: .*attention heads \(4\).* "
                                         r"divisible by the tensor-parallel size \(3\)"):
        LLM(path, skip_tokenizer_init=True, device="cpu", max_model_len=128, tensor_parallel_size=3)
    assert time.monotonic() - start < 10


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
def test_tp2_equals_tp1_on_gpu(kind, tiny_model_factory):
    path, _ = tiny_model_factory(kind)
    results = []
    for tp in (1, 2):
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cuda", max_model_len=128,
                  tensor_parallel_size=tp, kv_cache_memory_bytes=1 << 28)
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        results.append([o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)])
        llm.shutdown()
    assert results[0] == results[1]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("draft_tp", [1, 2], ids=["whole-on-driver", "sharded"])
def test_tp2_draft_model_on_gpu(draft_tp, tiny_model_factory):
    """A TP=2 target drafting for itself on two GPUs, the draft whole on the driver or
    sharded beside the target (its graphs and collectives in the same group): TP=1's
    greedy tokens, nearly every draft kept."""
    path, _ = tiny_model_factory("llama")
    spec = {"method": "draft_model", "model": path, "num_speculative_tokens": 3,
            "draft_tensor_parallel_size": draft_tp}
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    results, totals = [], None
    for tp in (1, 2):
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cuda", max_model_len=128,
                  tensor_parallel_size=tp, kv_cache_memory_bytes=1 << 28,
                  speculative_config=spec if tp == 2 else None)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
        results.append([o.outputs[0].token_ids for o in outs])
        if tp == 2:
            totals = llm.engine.scheduler.spec.totals()
        llm.shutdown()
    assert results[0] == results[1]
    assert totals[1] > 0 and totals[2] >= 0.95 * totals[1]
