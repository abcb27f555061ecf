"""The offline LLM as vLLM users rely on it: generation_config's EOS ids, the stop token's
text, stop strings held back by min_tokens, per-prompt pooling params, and a call cut
short by an exception (Ctrl-C) leaving the LLM usable."""

from __future__ import annotations

import json
import shutil
import threading

import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer

from loom import LLM, SamplingParams
from loom.pooling_params import PoolingParams

PROMPT = "The quick brown fox"
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_with_tokenizer):
    path, _ = tiny_llama_with_tokenizer
    return LLM(path, dtype="float32", device="cpu", max_model_len=128, seed=0)


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_llama_with_tokenizer):
    return HFTokenizer.from_file(f"{tiny_llama_with_tokenizer[0]}/tokenizer.json")


def _greedy_ids(llm: LLM, max_tokens: int = 12) -> list[int]:
    out = llm.generate(PROMPT, GREEDY.clone(max_tokens=max_tokens), use_tqdm=False)
    return out[0].outputs[0].token_ids


def _with_text(ids: list[int], hf_tokenizer, start: int) -> int:
    """The first position from `start` whose token decodes to visible text."""
    return next(i for i in range(start, len(ids)) if hf_tokenizer.decode([ids[i]]).strip())


def test_generation_config_eos_ids_stop_as_transformers(tiny_llama_with_tokenizer, tmp_path,
                                                        hf_tokenizer):
    src, hf_model = tiny_llama_with_tokenizer
    shutil.copytree(src, tmp_path, dirs_exist_ok=True)
    prompt_ids = hf_tokenizer.encode(PROMPT).ids
    with torch.no_grad():
        free = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=8, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(prompt_ids):].tolist()
    # Llama 3.1 Instruct's form: the tokenizer's EOS, and more ids in generation_config.
    extra = free[2]
    eos_ids = [128001, extra]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_ids}))
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([prompt_ids]), max_new_tokens=8, do_sample=False,
                                eos_token_id=eos_ids, pad_token_id=0)[0, len(prompt_ids):].tolist()
    assert ref == free[:free.index(extra) + 1]  # transformers stops at the extra id
    llm = LLM(str(tmp_path), dtype="float32", device="cpu", max_model_len=128)
    try:
        out = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8),
                           use_tqdm=False)[0].outputs[0]
        assert out.token_ids == ref
        assert out.finish_reason == "stop" and out.stop_reason == extra
        ignored = llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8,
                                                      ignore_eos=True), use_tqdm=False)
        assert ignored[0].outputs[0].token_ids == free
    finally:
        llm.shutdown()


def test_stop_token_text_left_out_unless_asked(llm, hf_tokenizer):
    ids = _greedy_ids(llm)
    at = _with_text(ids, hf_tokenizer, 3)
    stop_id = ids[at]
    cut = ids[:ids.index(stop_id) + 1]
    out = llm.generate(PROMPT, GREEDY.clone(stop_token_ids=[stop_id]), use_tqdm=False)[0].outputs[0]
    assert out.token_ids == cut and out.stop_reason == stop_id
    assert out.text == hf_tokenizer.decode(cut[:-1])
    kept = llm.generate(PROMPT, GREEDY.clone(stop_token_ids=[stop_id],
                                             include_stop_str_in_output=True), use_tqdm=False)
    assert kept[0].outputs[0].text == hf_tokenizer.decode(cut)


def test_stop_strings_wait_for_min_tokens(llm, hf_tokenizer):
    ids = _greedy_ids(llm)
    first = _with_text(ids, hf_tokenizer, 0)
    stop = hf_tokenizer.decode([ids[first]]).strip()
    early = llm.generate(PROMPT, GREEDY.clone(stop=[stop]), use_tqdm=False)[0].outputs[0]
    assert early.stop_reason == stop and len(early.token_ids) <= first + 1
    held = llm.generate(PROMPT, GREEDY.clone(stop=[stop], min_tokens=first + 3),
                        use_tqdm=False)[0].outputs[0]
    assert len(held.token_ids) > first + 3  # as vLLM: stop strings count past min_tokens


def test_none_and_tuples_for_stops(llm):
    params = SamplingParams(stop=None, stop_token_ids=None, max_tokens=2)
    assert params.stop == [] and params.stop_token_ids == []
    params = SamplingParams(stop=("a", "b"), stop_token_ids=(5, 6))
    assert params.stop == ["a", "b"] and params.stop_token_ids == [5, 6]


@pytest.mark.parametrize("bad, field", [
    ({"temperature": 0}, "sampling_params"),
    ([SamplingParams(), {"temperature": 0}], "sampling_params"),
])
def test_sampling_params_of_the_wrong_type(llm, bad, field):
    with pytest.raises(ValueError, match=field):
        llm.generate([PROMPT, PROMPT], bad, use_tqdm=False)


def test_text_prompt_without_tokenizer(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    llm = LLM(path, dtype="float32", device="cpu", max_model_len=64, skip_tokenizer_init=True)
    try:
        with pytest.raises(ValueError, match="needs a tokenizer"):
            llm.generate("hello", use_tqdm=False)
        assert len(llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2),
                                use_tqdm=False)[0].outputs[0].token_ids) == 2
    finally:
        llm.shutdown()


def test_pooling_params_per_prompt_and_wrong_type(llm):
    one = llm.embed(["hi", "there"], PoolingParams(), use_tqdm=False)
    each = llm.embed(["hi", "there"], [PoolingParams(), PoolingParams()], use_tqdm=False)
    assert [o.outputs.embedding for o in each] == [o.outputs.embedding for o in one]
    for bad in ("mean", ["mean", "mean"], [PoolingParams()]):
        with pytest.raises(ValueError, match="pooling_params"):
            llm.embed(["hi", "there"], bad, use_tqdm=False)
    assert len(_greedy_ids(llm, 3)) == 3  # nothing bad was queued


def _interrupt_on_call(monkeypatch, obj, name: str, call: int) -> None:
    """Make obj.name raise KeyboardInterrupt on its `call`-th call, as Ctrl-C would."""
    original, count = getattr(obj, name), [0]

    def wrapped(*args, **kwargs):
        count[0] += 1
        if count[0] == call:
            raise KeyboardInterrupt
        return original(*args, **kwargs)
    monkeypatch.setattr(obj, name, wrapped)


def _generate_within(llm: LLM, prompts, params, seconds: float):
    done: list = []
    thread = threading.Thread(target=lambda: done.append(llm.generate(prompts, params,
                                                                      use_tqdm=False)),
                              daemon=True)
    thread.start()
    thread.join(seconds)
    assert done, f"generate did not return within {seconds} s"
    return done[0]


@pytest.mark.parametrize("where", ["launch", "collect"])
def test_interrupted_generate_leaves_the_llm_usable(llm, monkeypatch, where):
    expected = _greedy_ids(llm)
    _interrupt_on_call(monkeypatch, llm.engine.executor, where, 3)
    many = SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([PROMPT] * 4, many, use_tqdm=False)
    monkeypatch.undo()
    outputs = _generate_within(llm, [PROMPT], GREEDY, 60)
    assert [o.outputs[0].token_ids for o in outputs] == [expected]
    kv = llm.engine.get_kv_info()
    assert kv["num_free_blocks"] == kv["num_blocks"]
