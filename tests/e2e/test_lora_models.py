"""LoRA on the architectures whose adaptable modules are not Llama's: Phi-3's fused
qkv_proj and gate_up_proj (PEFT trains one A and one B across the fused rows), and
Qwen2-MoE, whose attention takes adapters and whose shared expert does not; Gemma 2, whose
projections are Llama's under a decoder of its own; Granite, whose residual multiplier is
folded into o_proj and down_proj (their adapters' terms scaled alike). loom's greedy
tokens equal peft's."""

from __future__ import annotations

import pytest

from loom import LLM, SamplingParams
from loom.lora.request import LoRARequest
from tests.conftest import hf_greedy
from tests.e2e.test_correctness import _prompts
from tests.lora_util import make_adapter

pytest.importorskip("peft")

PHI3 = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
LLAMA = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.mark.parametrize("kind, targets, tp", [
    ("phi3", PHI3, 1), ("phi3", PHI3, 2), ("qwen2_moe", ("q_proj", "v_proj", "o_proj"), 1),
    ("gemma2", LLAMA, 1), ("granite", LLAMA, 2)],
    ids=["phi3", "phi3-tp2", "qwen2_moe-attention", "gemma2", "granite-tp2"])
def test_adapter_equals_peft(kind, targets, tp, tiny_model_factory, tmp_path):
    path, hf = tiny_model_factory(kind)
    model = make_adapter(path, str(tmp_path), targets=targets, r=4, alpha=8)
    lora = LoRARequest("a", 1, str(tmp_path))
    prompts = _prompts(seed=5, lengths=(6, 30))
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              enable_lora=True, max_lora_rank=8, tensor_parallel_size=tp)
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    try:
        outs = llm.generate(prompts + prompts, params, use_tqdm=False,
                            lora_request=[lora] * len(prompts) + [None] * len(prompts))
    finally:
        llm.shutdown()
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(model, prompt, 10)
        assert out.outputs[0].token_ids != hf_greedy(hf, prompt, 10)  # the adapter tells
    for prompt, out in zip(prompts, outs[len(prompts):]):
        assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 10)


def test_a_shared_expert_adapter_is_refused(tiny_model_factory, tmp_path):
    """peft adapts Qwen2-MoE's shared expert (a Linear per projection) where asked, and
    since peft 0.22 the routed experts' fused down_proj too; loom adapts no expert, and says
    so, naming the first such tensor, before the request runs."""
    path, _ = tiny_model_factory("qwen2_moe")
    make_adapter(path, str(tmp_path), targets=("down_proj",), r=4)
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64,
              enable_lora=True, max_lora_rank=8)
    with pytest.raises(ValueError, match=r"layers\.\d+\.mlp\.(shared_expert\.down_proj|experts)"
                                         r"\S*' targets what loom cannot adapt"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2),
                     lora_request=LoRARequest("s", 1, str(tmp_path)), use_tqdm=False)
