"""The engine's long-lived heap is out of the cyclic collector's reach once it has started."""

import gc

import pytest
import torch

from loom import LLM, SamplingParams, envs
from loom.core.block_pool import KVBlock


def test_start_up_freezes_the_schedulers_kv_blocks(tiny_model_factory):
    """The scheduler's KV blocks (one Python object each, tens of thousands on a GPU) are
    built after the model runner froze its heap; start-up freezes them too, so a full
    collection during a step does not walk them. The engine still serves afterwards."""
    path, _ = tiny_model_factory("llama")
    thresholds = gc.get_threshold()
    try:
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu",
                  max_model_len=128)
        assert gc.get_threshold() == envs.GC_THRESHOLDS  # the serving thresholds
        num_blocks = llm.engine.num_blocks
        assert num_blocks > 1000
        assert not any(isinstance(o, KVBlock) for o in gc.get_objects())
        assert gc.get_freeze_count() > num_blocks
        out = llm.generate([{"prompt_token_ids": [1, 2, 3]}],
                           SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 4
    finally:
        gc.unfreeze()  # the rest of the session's tests collect as usual
        gc.set_threshold(*thresholds)


@pytest.mark.parametrize("raw, want", [("", envs.GC_THRESHOLDS), ("700,10,10", (700, 10, 10)),
                                       (" 1000, 5,2 ", (1000, 5, 2))])
def test_gc_thresholds_from_the_environment(monkeypatch, raw, want):
    monkeypatch.setenv("LOOM_GC_THRESHOLDS", raw)
    assert envs.gc_thresholds() == want


@pytest.mark.parametrize("raw", ["700,10", "a,b,c", "700,0,10", "1,2,3,4"])
def test_bad_gc_thresholds_name_the_variable(monkeypatch, raw):
    monkeypatch.setenv("LOOM_GC_THRESHOLDS", raw)
    with pytest.raises(ValueError, match="LOOM_GC_THRESHOLDS: expected three positive"):
        envs.gc_thresholds()


def test_a_model_runner_takes_the_serving_thresholds_too(tiny_model_factory):
    """TP workers are processes of their own, each stepping in Python: the runner sets the
    same collector thresholds once it has started."""
    from loom.config import EngineConfig, ModelConfig
    from loom.worker.model_runner import ModelRunner
    path, _ = tiny_model_factory("llama")
    thresholds = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        runner = ModelRunner(EngineConfig(ModelConfig(model=path, dtype="float32")),
                             torch.device("cpu"))
        runner.initialize_cache(8)
        assert gc.get_threshold() == envs.GC_THRESHOLDS
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
