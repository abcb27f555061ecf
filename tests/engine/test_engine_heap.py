"""The engine's long-lived heap is out of the cyclic collector's reach once it has started."""

import gc

import torch

from loom import LLM, SamplingParams
from loom.core.block_pool import KVBlock


def test_start_up_freezes_the_schedulers_kv_blocks(tiny_model_factory):
    """The scheduler's KV blocks (one Python object each, tens of thousands on a GPU) are
    built after the model runner froze its heap; start-up freezes them too, so a full
    collection during a step does not walk them. The engine still serves afterwards."""
    path, _ = tiny_model_factory("llama")
    try:
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu",
                  max_model_len=128)
        num_blocks = llm.engine.num_blocks
        assert num_blocks > 1000
        assert not any(isinstance(o, KVBlock) for o in gc.get_objects())
        assert gc.get_freeze_count() > num_blocks
        out = llm.generate([{"prompt_token_ids": [1, 2, 3]}],
                           SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
        assert len(out[0].outputs[0].token_ids) == 4
    finally:
        gc.unfreeze()  # the rest of the session's tests collect as usual
