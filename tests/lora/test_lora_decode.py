"""LoRA at decode rows through its two kernels (loom.kernels.lora, interpreted here), at
level 3 with the decode GEMV pass on: the pass still hands the residual add + RMSNorm and
the SiLU·mul to the GEMV, the LoRA terms make the same inputs themselves, and the greedy
tokens equal peft's (the adapter applied by the library that trained it)."""

from __future__ import annotations

import logging
import random
import re

import pytest

import loom.kernels.gemv_decode as gemv_module
from loom import LLM, SamplingParams
from loom.kernels import lora as kernels
from loom.kernels.gemv import GemvConfig
from loom.lora import layers
from loom.lora.request import LoRARequest
from tests.conftest import graphs_compiled_anew, hf_greedy
from tests.lora_util import make_adapter

pytest.importorskip("peft")


@pytest.mark.slow
def test_decode_fusions_survive_an_adapter(tiny_model_factory, tmp_path, monkeypatch, caplog):
    path, hf = tiny_model_factory("llama")
    peft_model = make_adapter(path, str(tmp_path / "adapter"), r=8, alpha=16, seed=10)
    lora = LoRARequest("adapter", 1, str(tmp_path / "adapter"))
    inputs = []  # per kernel call: (rows, the norm's weight handed over, silu_mul)
    real = kernels.lora_add

    def spy(y, x, a, b, mask, **kwargs):
        inputs.append((x.shape[0], kwargs["norm_weight"] is not None, kwargs["silu_mul"]))
        return real(y, x, a, b, mask, **kwargs)

    monkeypatch.setattr(kernels, "lora_add", spy)
    monkeypatch.setattr(layers, "_use_kernels", lambda x: True)  # the CUDA path, interpreted
    monkeypatch.setenv("LOOM_DECODE_GEMV", "1")
    monkeypatch.setenv("LOOM_DECODE_NORM_GEMV", "1")
    monkeypatch.setattr(gemv_module, "tuned_config",
                        lambda m, n, k, dtype, device: GemvConfig(block_n=64, block_k=64))
    caplog.set_level(logging.INFO, logger="loom.compilation.passes.decode_gemv")
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 256) for _ in range(n)] for n in (7, 18, 5)]
    loras = [lora, None, lora]
    with graphs_compiled_anew():  # a cached graph would load without the pass (or its log line)
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu",
                  max_model_len=128, max_num_batched_tokens=64, enable_lora=True,
                  max_lora_rank=8, max_loras=1, compilation_config={"level": 3})
        outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=5,
                                                    ignore_eos=True),
                            lora_request=loras, use_tqdm=False)
    for prompt, adapter, out in zip(prompts, loras, outs):
        assert out.outputs[0].token_ids == hf_greedy(peft_model if adapter else hf, prompt, 5)
    # As without LoRA (tests/compilation/test_decode_gemv_pass.py): the SiLU·mul before
    # each of the 2 layers' down projection, the add + norm before 3 of their 4 matmuls.
    fused = re.findall(r"(\d+) of them with the SiLU·mul before them", caplog.text)
    assert sum(map(int, fused)) == 2, fused
    fused = re.findall(r"(\d+) with the residual add \+ RMSNorm", caplog.text)
    assert sum(map(int, fused)) == 3, fused
    assert inputs and max(rows for rows, _, _ in inputs) <= kernels.MAX_M
    handed = {(norm, silu) for _, norm, silu in inputs}
    assert handed == {(False, False), (True, False), (False, True)}, handed
