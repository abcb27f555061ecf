"""Sleep mode and worker calls over TP=2 worker processes on the CPU: a trainer's weights
loaded through a worker extension after a level 2 sleep give transformers' tokens for
those weights, and a module-level function reaches every rank pickled."""

import os

import pytest
import torch

from tests.conftest import hf_greedy, make_tiny_model
from loom import LLM, SamplingParams

PROMPTS = [[1, 5, 9, 20, 33, 47], [2, 7, 11, 3, 60]]
SP = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
EXTENSION = "tests.engine.weight_sync.WeightSync"


def rank_and_pid(worker) -> list:
    return [worker.rank, os.getpid()]


def _generate(llm) -> list[list[int]]:
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], SP, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_a_trainers_weights_reach_both_ranks_through_the_extension(tiny_model_factory,
                                                                    tmp_path):
    path, hf = tiny_model_factory("llama")
    other = make_tiny_model("llama", str(tmp_path / "other"), seed=2)
    torch.save(other.state_dict(), tmp_path / "trained.pt")
    llm = LLM(path, tensor_parallel_size=2, enable_sleep_mode=True, enforce_eager=True,
              skip_tokenizer_init=True, worker_extension_cls=EXTENSION)
    try:
        assert _generate(llm) == [hf_greedy(hf, p, SP.max_tokens) for p in PROMPTS]
        llm.sleep(level=2)
        llm.wake_up(tags=["weights"])
        assert llm.collective_rpc("load_state_dict_file",
                                  args=(str(tmp_path / "trained.pt"),)) == [0, 1]
        llm.wake_up(tags=["kv_cache"])
        assert _generate(llm) == [hf_greedy(other, p, SP.max_tokens) for p in PROMPTS]
        ranks = llm.collective_rpc(rank_and_pid)
        assert [r[0] for r in ranks] == [0, 1] and os.getpid() not in [r[1] for r in ranks]
        with pytest.raises(ValueError, match="take a picklable function"):
            llm.collective_rpc(lambda worker: worker.rank)
        with pytest.raises(ValueError, match="known: .*load_state_dict_file"):
            llm.collective_rpc("train")
    finally:
        llm.shutdown()


@pytest.mark.parametrize("name, match", [
    ("tests.engine.weight_sync.Missing", "cannot import 'tests.engine.weight_sync.Missing'"),
    ("WeightSync", "must name a class as module.Class"),
    ("tests.engine.weight_sync.Clashing", "defines sleep, which loom's Worker has"),
])
def test_a_bad_extension_is_refused_by_name(tiny_model_factory, name, match):
    with pytest.raises(ValueError, match=match):
        LLM(tiny_model_factory("llama")[0], enforce_eager=True, skip_tokenizer_init=True,
            worker_extension_cls=name)
