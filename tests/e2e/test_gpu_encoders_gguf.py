"""Session 44's model paths on the GPU: an encoder's padded both-ways SDPA (XLM-R in
bfloat16 and float32, EmbeddingGemma) against transformers on the CPU, and a GGUF
Qwen3-MoE's experts through the fused MoE kernels against the same file on the CPU.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from loom import LLM, SamplingParams
from tests.e2e.test_encoders import _make, _prompts, _reference, check_embedding_gemma

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-4), ("bfloat16", 3e-2)])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_gpu_encoder_embeddings_equal_transformers(tmp_path, dtype, tol, pooling):
    model = _make("xlm-roberta", tmp_path, pooling)
    llm = LLM(str(tmp_path), skip_tokenizer_init=True, dtype=dtype, device="cuda",
              gpu_memory_utilization=0.2)
    prompts = _prompts()
    outs = llm.embed([{"prompt_token_ids": p} for p in prompts], use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        torch.testing.assert_close(torch.tensor(out.outputs.embedding),
                                   _reference(model, prompt, pooling), rtol=tol, atol=tol)
    llm.shutdown()


def test_gpu_embedding_gemma_equals_transformers(tmp_path):
    """BidirectionalAttention's SDPA with grouped heads and window masks on the GPU."""
    check_embedding_gemma(tmp_path, "cuda", gpu_memory_utilization=0.2)


def test_gpu_gguf_moe_equals_cpu(tmp_path_factory):
    from tests.models.gguf_convert import convert
    from tests.models.test_gguf_archs import _own_configs, _tiny
    hf_dir = tmp_path_factory.mktemp("qwen3-moe")
    _tiny(_own_configs()["qwen3_moe"](), hf_dir)
    path = str(convert(hf_dir, tmp_path_factory.mktemp("gguf") / "moe.gguf"))
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=5)
    prompts = [{"prompt_token_ids": p} for p in _prompts((5, 17, 33))]
    runs = []
    for device in ("cpu", "cuda"):
        llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device=device,
                  max_model_len=256, **({"gpu_memory_utilization": 0.2}
                                        if device == "cuda" else {}))
        runs.append(llm.generate(prompts, params, use_tqdm=False))
        llm.shutdown()
    for cpu, gpu in zip(*runs):
        assert gpu.outputs[0].token_ids[:4] == cpu.outputs[0].token_ids[:4]
        first = cpu.outputs[0].token_ids[0]
        assert abs(gpu.outputs[0].logprobs[0][first].logprob
                   - cpu.outputs[0].logprobs[0][first].logprob) < 0.05
