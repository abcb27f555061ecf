"""fp8 linear layers against compressed-tensors' fake quantization, as transformers runs an
fp8 checkpoint: greedy tokens equal, logprobs within float32 rounding, on the CPU."""

from __future__ import annotations

import pytest
import torch

from loom import LLM, SamplingParams
from tests.conftest import hf_greedy, hf_last_logprobs, make_tiny_model

pytest.importorskip("compressed_tensors")

from tests.quantization.fp8_checkpoints import (checkpoint_cache,  # noqa: E402
                                                load_reference, tp_reference,
                                                write_fp8_checkpoint)

PROMPTS = [[1, 5, 9, 33, 7, 100, 200, 3], [4, 44, 144, 240, 17, 9, 9, 30, 31, 2, 77], [8, 8]]
NEW_TOKENS = 10
ROUTER = "re:.*mlp.gate$"

CASES = {  # id -> (model kind, scheme, ignored modules)
    "llama-dynamic": ("llama", "fp8-dynamic", ["lm_head", "re:.*layers.1.mlp.down_proj"]),
    "qwen2-static": ("qwen2", "fp8-static", ["lm_head"]),
    "qwen3-tensor-dynamic": ("qwen3", "fp8-tensor-dynamic", ["lm_head"]),
    "qwen3_moe-dynamic": ("qwen3_moe", "fp8-dynamic", ["lm_head", ROUTER]),
    # Fused qkv_proj / gate_up_proj: per-tensor weight and input scales for all the rows;
    # the ignore list names a fused module as the checkpoint has it
    "phi3-static": ("phi3", "fp8-static", ["lm_head", "model.layers.1.self_attn.qkv_proj"]),
    # Llama's projections under Gemma's decoder, its LM head tied to the embeddings
    "gemma2-dynamic": ("gemma2", "fp8-dynamic", ["lm_head"]),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """case id -> (fp8 checkpoint path, transformers' fp8 model, unquantized path and model)."""
    return checkpoint_cache(tmp_path_factory, CASES)


def _llm(path: str, **kwargs) -> LLM:
    return LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
               max_logprobs=-1, **kwargs)


def _check_against(llm: LLM, reference, unquantized) -> None:
    try:
        _compare(llm, reference, unquantized)
    finally:
        llm.shutdown()


def _compare(llm: LLM, reference, unquantized) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            logprobs=256)
    outs = llm.generate(PROMPTS, params, use_tqdm=False)
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_greedy(reference, prompt, NEW_TOKENS)
        ours = torch.tensor([out.outputs[0].logprobs[0][t].logprob for t in range(256)])
        ref = hf_last_logprobs(reference, prompt)
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
        # The check can fail: fp8 moves the logprobs far more than the tolerance.
        assert (ref - hf_last_logprobs(unquantized, prompt)).abs().max() > 1e-2


@pytest.mark.parametrize("case", list(CASES))
def test_fp8_checkpoint_matches_compressed_tensors(case, checkpoints):
    path, reference, _, unquantized = checkpoints(case)
    _check_against(_llm(path), reference, unquantized)


def test_quantizing_at_load_equals_the_fp8_dynamic_checkpoint(checkpoints, tmp_path):
    """--quantization fp8 on an unquantized checkpoint quantizes as llm-compressor's
    FP8_DYNAMIC (a scale per output channel, activations per token); compiled at level 3."""
    path, reference, base, unquantized = checkpoints("qwen3-tensor-dynamic")
    fp8 = str(tmp_path / "fp8-dynamic")
    write_fp8_checkpoint(make_tiny_model("qwen3", str(tmp_path / "b")), fp8, "fp8-dynamic",
                         ["lm_head"])
    _check_against(_llm(base, quantization="fp8", compilation_config=3), load_reference(fp8),
                   unquantized)


@pytest.mark.parametrize("case", ["llama-dynamic", "qwen2-static"])
def test_tensor_parallel(case, checkpoints):
    """TP=2 on gloo. Static input scales are global, so TP=2 computes what TP=1 does; with
    dynamic scales each row-parallel rank scales its own half of a token's features, which
    compressed-tensors runs as per-group activation scales (groups of half the width)."""
    path, reference, base, unquantized = checkpoints(case)
    if case == "llama-dynamic":
        kind, _, ignore = CASES[case]
        reference = tp_reference(make_tiny_model(kind, base), 2, ignore)
    _check_against(_llm(path, tensor_parallel_size=2), reference, unquantized)


def test_lora_over_fp8_layers_matches_peft(checkpoints, tmp_path):
    """An adapter's term is added to the fp8 matmul's output, as peft adds it over
    compressed-tensors' quantized Linear."""
    from loom.lora.request import LoRARequest
    from tests.lora_util import make_adapter
    path, reference, _, _ = checkpoints("llama-dynamic")
    peft_model = make_adapter(path, str(tmp_path / "adapter"))
    llm = _llm(path, enable_lora=True)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        outs = llm.generate(PROMPTS, params, use_tqdm=False,
                            lora_request=LoRARequest("a", 1, str(tmp_path / "adapter")))
    finally:
        llm.shutdown()
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_greedy(peft_model, prompt, NEW_TOKENS)
        assert out.outputs[0].token_ids != hf_greedy(reference, prompt, NEW_TOKENS)
