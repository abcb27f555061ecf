"""Unset batch limits: loom's defaults, raised to vLLM's on a large GPU; given ones stay."""

from __future__ import annotations

import pytest

from loom import LLM
from loom.config import device_batch_defaults
from loom.engine.arg_utils import EngineArgs

H200 = (141 * 2**30, "NVIDIA H200")


@pytest.mark.parametrize("usage, expected", [("offline", (1024, 16384)), ("server", (1024, 8192))])
def test_a_large_gpu_raises_the_unset_limits(usage, expected):
    config = EngineArgs(model="llama-3.1-8b").create_engine_config(usage=usage)
    assert (config.scheduler.max_num_seqs, config.scheduler.max_num_batched_tokens) == (256, 8192)
    sched = device_batch_defaults(config, *H200).scheduler
    assert (sched.max_num_seqs, sched.max_num_batched_tokens, sched.unset) == (*expected, ())


def test_given_limits_stay_and_small_gpus_and_a100_keep_loom_defaults():
    given = EngineArgs(model="llama-3.1-8b", max_num_seqs=64).create_engine_config()
    sched = device_batch_defaults(given, *H200).scheduler
    assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (64, 16384)
    config = EngineArgs(model="llama-3.1-8b").create_engine_config()
    for memory, name in [(24 * 2**30, "NVIDIA L4"), (80 * 2**30, "NVIDIA A100-SXM4-80GB")]:
        assert device_batch_defaults(config, memory, name) is config


def test_the_engine_runs_with_the_limits_its_workers_resolved(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64,
              max_num_batched_tokens=32)
    sched = llm.engine.config.scheduler
    assert (sched.max_num_seqs, sched.max_num_batched_tokens, sched.unset) == (256, 32, ())
    assert llm.engine.scheduler.config is sched
