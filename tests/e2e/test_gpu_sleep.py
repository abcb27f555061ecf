"""Sleep mode on CUDA: a sleep gives the weights' and the KV cache's memory back to the
driver, and after a wake-up the same CUDA graphs and compiled code (their addresses kept)
give the tokens they gave before. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from loom import LLM, SamplingParams
from tests.e2e.test_correctness import _prompts

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
KV_BYTES = 256 * 2**20


def _tokens(llm) -> list[list[int]]:
    outs = llm.generate(_prompts(5, (5, 40, 17, 90, 3, 33)), PARAMS, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("compilation", [dict(), dict(enforce_eager=True),
                                         dict(compilation_config={"cudagraph_mode": "FULL"})],
                         ids=["default", "eager", "full-graphs"])
def test_gpu_sleep_frees_memory_and_wakes_to_the_same_tokens(compilation, tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    llm = LLM(path, skip_tokenizer_init=True, max_model_len=256, device="cuda",
              enable_sleep_mode=True, kv_cache_memory_bytes=KV_BYTES, **compilation)
    try:
        before = _tokens(llm)
        free = torch.cuda.mem_get_info()[0]
        llm.sleep(level=1)
        assert torch.cuda.mem_get_info()[0] - free >= KV_BYTES * 0.95  # the cache at least
        llm.wake_up()
        assert _tokens(llm) == before
        llm.sleep(level=2)
        llm.wake_up(tags=["weights"])
        llm.collective_rpc("reload_weights")
        llm.wake_up(tags=["kv_cache"])
        assert _tokens(llm) == before
        running = torch.cuda.mem_get_info()[0]
    finally:
        llm.shutdown()
    import gc
    gc.collect()
    # The regions went with the engine: the KV cache's memory is the driver's again.
    assert torch.cuda.mem_get_info()[0] - running >= KV_BYTES * 0.95
