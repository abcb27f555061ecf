"""EngineArgs as vLLM users pass them: wrong-typed booleans, vLLM's no-op
trust_remote_code, and vLLM's rule between the two batch limits."""

from __future__ import annotations

import pytest

from loom.config import SchedulerConfig
from loom.engine.arg_utils import EngineArgs


@pytest.mark.parametrize("field", ["enforce_eager", "enable_prefix_caching", "async_scheduling",
                                   "trust_remote_code", "enable_chunked_prefill"])
@pytest.mark.parametrize("value", ["no", "false", 1, None])
def test_boolean_fields_take_only_booleans(field, value):
    args = EngineArgs(model="llama-3.1-8b", load_format="dummy", **{field: value})
    with pytest.raises(ValueError, match=f"^{field}: must be True or False, got {value!r}$"):
        args.create_engine_config()


def test_trust_remote_code_is_accepted_and_changes_nothing():
    plain = EngineArgs(model="llama-3.1-8b", load_format="dummy").create_engine_config()
    trusted = EngineArgs(model="llama-3.1-8b", load_format="dummy",
                         trust_remote_code=True).create_engine_config()
    assert trusted == plain


def test_chunked_prefill_is_accepted_on_and_refused_off():
    plain = EngineArgs(model="llama-3.1-8b", load_format="dummy").create_engine_config()
    assert EngineArgs(model="llama-3.1-8b", load_format="dummy",
                      enable_chunked_prefill=True).create_engine_config() == plain
    with pytest.raises(ValueError, match="^enable_chunked_prefill: loom always schedules"):
        EngineArgs(model="llama-3.1-8b", load_format="dummy",
                   enable_chunked_prefill=False).create_engine_config()


def test_llm_takes_trust_remote_code(tiny_model_factory):
    from loom import LLM, SamplingParams
    path, _ = tiny_model_factory("llama")
    llm = LLM(path, trust_remote_code=True, skip_tokenizer_init=True, device="cpu",
              max_model_len=32, enforce_eager=True)
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 2


def test_batched_tokens_may_not_be_below_max_num_seqs():
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(8\) must be at least "
                                         r"max_num_seqs \(64\)"):
        SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=8)
    with pytest.raises(ValueError, match="max_num_seqs"):
        EngineArgs(model="llama-3.1-8b", load_format="dummy", max_num_seqs=64,
                   max_num_batched_tokens=8).create_engine_config()
    SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=8)  # equal is fine


@pytest.mark.parametrize("device, memory", [(None, 0), ("NVIDIA H200", 140 * 2**30)])
def test_a_default_max_num_seqs_is_capped_at_the_given_token_budget(device, memory):
    """As vLLM: --max-num-batched-tokens 16 alone runs, with at most 16 requests a step."""
    got = SchedulerConfig(max_num_batched_tokens=16).resolved(device, memory)
    assert (got.max_num_batched_tokens, got.max_num_seqs) == (16, 16)
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(8192\)"):
        SchedulerConfig(max_num_seqs=9000).resolved(None, 0)
