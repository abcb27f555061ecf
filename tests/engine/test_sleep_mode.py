"""vLLM's sleep mode on the CPU: what a sleep frees reads as 0xFF (NaN) until woken, a
wake-up brings back transformers' greedy tokens, a level 2 sleep needs its weights loaded
again, and each PauseMode treats the requests a sleep finds as vLLM's does."""

import pytest
import torch

from tests.conftest import hf_greedy, make_tiny_model
from loom import LLM, SamplingParams
from loom.engine.protocol import FinishReason

PROMPTS = [[1, 5, 9, 20, 33, 47], [2, 7, 11, 3, 60], [4, 4, 8, 15, 16, 23, 42]]
SP = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)


def _down_proj_is_nan(model) -> bool:
    return bool(torch.isnan(model.model.layers[0].mlp.down_proj.weight).all())


@pytest.fixture(scope="module")
def tiny(tiny_model_factory):
    return tiny_model_factory("llama")


@pytest.fixture(scope="module")
def llm(tiny):
    llm = LLM(tiny[0], enable_sleep_mode=True, enforce_eager=True, skip_tokenizer_init=True)
    yield llm
    llm.shutdown()


@pytest.fixture(autouse=True)
def _awake(llm):
    yield
    llm.wake_up()
    assert not llm.is_sleeping()


def _generate(llm, prompts=PROMPTS) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], SP, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def _reference(hf, prompts=PROMPTS) -> list[list[int]]:
    return [hf_greedy(hf, p, SP.max_tokens) for p in prompts]


def test_level_1_frees_and_restores_the_weights_and_the_cache(llm, tiny):
    expected = _reference(tiny[1])
    assert _generate(llm) == expected  # (these prompts' prefixes are cached now)
    llm.sleep(level=1)
    assert llm.is_sleeping()
    assert llm.apply_model(_down_proj_is_nan) == [True]  # the region was overwritten
    with pytest.raises(RuntimeError, match="asleep; call wake_up"):
        _generate(llm)
    llm.wake_up()
    assert not llm.is_sleeping()
    assert llm.apply_model(_down_proj_is_nan) == [False]
    # The cache came back zeroed: a prefix-cache hit on the old blocks would read zeros.
    assert _generate(llm) == expected


def test_level_2_discards_the_weights_until_they_are_reloaded(llm, tiny):
    llm.sleep(level=2)
    llm.wake_up(tags=["weights"])
    assert llm.is_sleeping()  # the KV cache still sleeps
    assert llm.apply_model(_down_proj_is_nan) == [True]
    # The rotary tables are buffers, kept as vLLM keeps a model's buffers.
    assert llm.apply_model(lambda m: not any(torch.isnan(b).any() for b in m.buffers())) \
        == [True]
    llm.collective_rpc("reload_weights")
    llm.wake_up(tags=["kv_cache"])
    assert _generate(llm) == _reference(tiny[1])


def test_update_weights_loads_another_models_tensors_in_place(llm, tiny, tmp_path):
    other = make_tiny_model("llama", str(tmp_path), seed=1)
    try:
        llm.sleep(level=2)
        with pytest.raises(ValueError, match=r"weights are asleep: wake_up\(tags=\['weights'\]\)"):
            llm.collective_rpc("update_weights", args=(list(other.state_dict().items()),))
        llm.wake_up(tags=["weights"])
        state = list(other.state_dict().items())
        half = len(state) // 2  # an update in two parts, as a trainer streams it
        llm.collective_rpc("update_weights", args=(state[:half],))
        llm.collective_rpc("update_weights", kwargs={"weights": state[half:]})
        llm.wake_up()
        got = _generate(llm)
        assert got == _reference(other)
        assert got != _reference(tiny[1])
    finally:
        llm.collective_rpc("reload_weights")
    assert _generate(llm) == _reference(tiny[1])


def test_collective_rpc_runs_a_function_with_each_worker(llm):
    def vocab(worker, plus, times=1):
        return (worker.model_runner.arch.vocab_size + plus) * times
    size = llm.collective_rpc("model_info")[0]["vocab_size"]
    assert llm.collective_rpc(vocab, args=(1,), kwargs={"times": 2}) == [(size + 1) * 2]
    with pytest.raises(ValueError, match="'launch' is not a worker method loom exposes"):
        llm.collective_rpc("launch")
    with pytest.raises(ValueError, match="must be a method name or a callable"):
        llm.collective_rpc(3)
    with pytest.raises(NotImplementedError, match="timeout"):
        llm.collective_rpc("model_info", timeout=5.0)


@pytest.mark.parametrize("bad, match", [
    ({"level": 3}, r"sleep.level: must be 0, 1 or 2, got 3"),
    ({"level": True}, r"sleep.level: must be 0, 1 or 2, got True"),
    ({"mode": "later"}, r"sleep.mode: must be one of abort, wait, keep, got 'later'"),
    ({"tags": ["weights", "lora"]}, r"sleep.tags: 'lora' is not a memory tag"),
    ({"tags": "weights"}, r"sleep.tags: must be a list"),
])
def test_bad_sleep_arguments_are_refused_and_change_nothing(llm, bad, match):
    with pytest.raises(ValueError, match=match):
        llm.sleep(**bad)
    assert not llm.is_sleeping()
    with pytest.raises(ValueError, match=r"wake_up.tags: 'kv' is not a memory tag"):
        llm.wake_up(tags=["kv"])


def test_sleep_needs_sleep_mode(tiny):
    llm = LLM(tiny[0], enforce_eager=True, skip_tokenizer_init=True)
    try:
        with pytest.raises(ValueError, match=r"sleep mode is off; start the engine with "
                                             r"enable_sleep_mode=True \(--enable-sleep-mode\)"):
            llm.sleep(level=1)
        assert not llm.is_sleeping()
        llm.sleep(level=0)  # pausing alone needs no sleep mode, as in vLLM
        assert llm.is_sleeping()
        llm.wake_up()
        assert not llm.is_sleeping()
    finally:
        llm.shutdown()


def _add(llm, prompts) -> dict[str, list[int]]:
    tokens = {}
    for i, prompt in enumerate(prompts):
        rid = f"r{len(tokens)}-{prompt[0]}-{i}"
        llm.engine.add_request(llm.processor.process(rid, prompt, SP))
        tokens[rid] = []
    return tokens


def _take(outputs, tokens, finished) -> None:
    for out in outputs:
        tokens[out.request_id] += out.new_token_ids
        if out.finish_reason is not None:
            finished[out.request_id] = out.finish_reason


def _drain(llm, tokens, finished) -> None:
    while llm.engine.has_unfinished_requests():
        _take(llm.engine.step().outputs, tokens, finished)
    _take(llm.engine.step().outputs, tokens, finished)


def test_mode_abort_ends_the_requests_a_sleep_finds(llm):
    tokens, finished = _add(llm, PROMPTS[:2]), {}
    _take(llm.engine.step().outputs, tokens, finished)
    llm.engine.sleep(1, "abort")
    _take(llm.engine.step().outputs, tokens, finished)
    assert finished == {rid: FinishReason.ABORT for rid in tokens}
    assert all(len(t) < SP.max_tokens for t in tokens.values())
    assert llm.engine.get_num_unfinished_requests() == 0


def test_mode_keep_resumes_them_after_wake_up_and_holds_new_ones(llm, tiny):
    tokens, finished = _add(llm, PROMPTS[:2]), {}
    _take(llm.engine.step().outputs, tokens, finished)
    llm.engine.sleep(1, "keep")
    tokens.update(_add(llm, PROMPTS[2:]))  # arrives asleep: waits
    _take(llm.engine.step().outputs, tokens, finished)
    assert not llm.engine.has_unfinished_requests()  # nothing runs asleep
    assert llm.engine.get_num_unfinished_requests() == 3 and not finished
    llm.engine.wake_up()
    _drain(llm, tokens, finished)
    assert list(tokens.values()) == _reference(tiny[1])  # recomputed over a fresh cache
    assert set(finished.values()) == {FinishReason.LENGTH}


def test_mode_wait_finishes_them_before_sleeping(llm, tiny):
    tokens, finished = _add(llm, PROMPTS[:2]), {}
    _take(llm.engine.step().outputs, tokens, finished)
    llm.engine.sleep(1, "wait")
    assert llm.engine.is_sleeping()
    _take(llm.engine.step().outputs, tokens, finished)
    assert list(tokens.values()) == _reference(tiny[1], PROMPTS[:2])
    assert set(finished.values()) == {FinishReason.LENGTH}


def test_the_workers_sleep_is_the_engines_alone(llm):
    """A worker put to sleep behind the engine's back would run steps over freed memory."""
    with pytest.raises(ValueError, match="'sleep' is not a worker method loom exposes"):
        llm.collective_rpc("sleep", args=(["weights"],))
    assert llm.apply_model(_down_proj_is_nan) == [False]


def test_the_regions_go_with_the_engine(tiny):
    """On CUDA a region unmaps its memory when collected: nothing may keep it after
    shutdown (`tests/e2e/test_gpu_sleep.py` measures the memory given back)."""
    import gc
    import weakref
    llm = LLM(tiny[0], enable_sleep_mode=True, enforce_eager=True, skip_tokenizer_init=True)
    memory = llm.engine.executor.worker.model_runner.sleep_memory
    regions = [weakref.ref(r) for r in [memory.weights, *memory.kv]]
    del memory
    llm.shutdown()
    gc.collect()
    assert len(regions) == 2 and all(r() is None for r in regions)
