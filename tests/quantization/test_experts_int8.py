"""`--quantization experts_int8` (vLLM's): an unquantized checkpoint's MoE experts rounded to
int8 per output channel as they load (scale amax / 127, round to nearest, symmetric) and run
as 8-bit weight-only experts, the dense layers in the model's dtype. The reference is the
definition computed here with torch ops: the same checkpoint with each expert weight
replaced by its rounded values times their scale, run by transformers in float32. Nothing
else is quantized, so the logprobs agree to float32 rounding."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from loom import LLM, SamplingParams
from tests.conftest import hf_greedy, hf_last_logprobs, make_tiny_model
from tests.quantization.test_fp8_loading import _linear_layers, _load

PROMPTS = [[1, 5, 9, 33, 7, 100, 200, 3], [4, 44, 144, 240, 17, 9, 9, 30, 31, 2, 77], [8, 8]]


def _rounded_experts(path: str, dest: str, tp: int) -> str:
    """A copy of the checkpoint at `path` with every expert weight rounded to int8 per
    row and back, in float32; at tensor-parallel size tp, down's rows per rank's slice of
    its columns (each rank rounds the part it holds)."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(path, dest, dirs_exist_ok=True)
    tensors = load_file(Path(path) / "model.safetensors")
    experts = [n for n in tensors if ".mlp.experts." in n and n.endswith("_proj.weight")]
    assert experts
    for name in experts:
        parts = tensors[name].float().chunk(tp if "down_proj" in name else 1, dim=1)
        scales = [w.abs().amax(dim=1, keepdim=True) / 127 for w in parts]
        tensors[name] = torch.cat([torch.round(w / s) * s for w, s in zip(parts, scales)], 1)
    save_file(tensors, Path(dest) / "model.safetensors", metadata={"format": "pt"})
    return dest


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """(unquantized qwen3_moe path and model, tp -> transformers on its experts rounded as
    that tensor-parallel size rounds them)."""
    import transformers as tf
    base = str(tmp_path_factory.mktemp("moe"))
    unquantized = make_tiny_model("qwen3_moe", base)
    references = {tp: tf.AutoModelForCausalLM.from_pretrained(
        _rounded_experts(base, str(tmp_path_factory.mktemp(f"rounded-{tp}")), tp),
        dtype=torch.float32).eval() for tp in (1, 2)}
    return base, unquantized, references


@pytest.mark.parametrize("tp", [1, 2])
def test_experts_int8_matches_the_rounded_experts(tp, moe):
    """At TP=2 each rank rounds its rows of gate and up (the same scales as TP=1) and its
    half of down's columns (a scale per row of its half)."""
    path, unquantized, references = moe
    reference = references[tp]
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=128,
              max_logprobs=-1, quantization="experts_int8", tensor_parallel_size=tp)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=256)
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        llm.shutdown()
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_greedy(reference, prompt, 8)
        ours = torch.tensor([out.outputs[0].logprobs[0][t].logprob for t in range(256)])
        ref = hf_last_logprobs(reference, prompt)
        torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
        # The check can fail: rounding the experts moves the logprobs far more.
        assert (ref - hf_last_logprobs(unquantized, prompt)).abs().max() > 1e-3


def test_only_the_experts_are_quantized(moe):
    path, _, _ = moe
    model = _load(path, dtype="bfloat16", quantization="experts_int8")
    experts = model.get_submodule("model.layers.0.mlp.experts")
    assert experts.w13.dtype == experts.w2.dtype == torch.int32 and experts.int4.bits == 8
    assert experts.w13_scale.dtype == torch.bfloat16
    assert all(m.weight.dtype == torch.bfloat16 and m.quant is None
               for m in _linear_layers(model).values())
    dummy = _load(path, dtype="bfloat16", quantization="experts_int8", load_format="dummy")
    assert dummy.get_submodule("model.layers.0.mlp.experts").w2.dtype == torch.int32


def test_a_dense_model_is_left_as_it_is(tiny_model_factory, caplog):
    path, _ = tiny_model_factory("llama")
    plain = _load(path, dtype="float32")
    model = _load(path, dtype="float32", quantization="experts_int8")
    assert "has no MoE layers; nothing is quantized" in caplog.text
    for (name, a), (_, b) in zip(plain.named_parameters(), model.named_parameters()):
        assert torch.equal(a, b), name


def test_a_quantized_checkpoint_is_refused():
    from loom.quantization.config import quant_scheme
    with pytest.raises(ValueError, match=r"'experts_int8' quantizes an unquantized checkpoint's "
                                         r"MoE experts at load; this checkpoint is already "
                                         r"quantized \(quant_method 'awq'\)"):
        quant_scheme({"quantization_config": {"quant_method": "awq"}}, "experts_int8")
