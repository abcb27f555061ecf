"""int4 weight-only layers (W4A16) against compressed-tensors' fake quantization of the same
weights: greedy tokens equal, logprobs within float32 rounding, on the CPU. The same
integers in AutoAWQ's and GPTQ's layouts give the same model; the AWQ layout is first
checked against compressed-tensors' own AutoAWQ converter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from loom import SamplingParams
from tests.conftest import hf_greedy, make_tiny_model

pytest.importorskip("compressed_tensors")

from tests.quantization.int4_checkpoints import (GROUP, as_awq, as_gptq,  # noqa: E402
                                                 write_int4_checkpoint)
# greedy tokens equal, logprobs within 1e-4, and the reference's logprobs moved by quantizing
from tests.quantization.test_fp8 import NEW_TOKENS, PROMPTS, _check_against, _llm  # noqa: E402

AWQ_DENSE = ["layers.1.mlp.down_proj"]
"""llama-asym's dense layer, as AutoAWQ's modules_to_not_convert names it."""

CASES = {  # id -> (model kind, group size (None: per channel), symmetric, ignored modules)
    "llama-asym": ("llama", GROUP, False, ["lm_head", "re:.*layers.1.mlp.down_proj"]),
    "qwen2-sym-channel": ("qwen2", None, True, ["lm_head"]),
    "qwen3-sym": ("qwen3", GROUP, True, ["lm_head"]),
    "gemma2-asym": ("gemma2", 64, False, ["lm_head"]),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """case id -> (int4 checkpoint path, compressed-tensors' model, unquantized model)."""
    cache = {}

    def get(case: str):
        if case not in cache:
            kind, group, symmetric, ignore = CASES[case]
            base = str(tmp_path_factory.mktemp(f"{kind}-base"))
            path = str(tmp_path_factory.mktemp(case))
            reference = write_int4_checkpoint(make_tiny_model(kind, base), path, group,
                                              symmetric, ignore)
            cache[case] = (path, reference, make_tiny_model(kind, base))
        return cache[case]
    return get


@pytest.mark.parametrize("case", list(CASES))
def test_compressed_tensors_int4_matches_its_fake_quantization(case, checkpoints):
    path, reference, unquantized = checkpoints(case)
    _check_against(_llm(path), reference, unquantized)


def test_awq_layout_is_compressed_tensors_converters(checkpoints, tmp_path):
    """The AWQ checkpoint the tests write converts back to the compressed-tensors one,
    tensor for tensor, through compressed-tensors' AutoAWQ converter: the layout (the
    transposition, the nibble order, the zero points) is AutoAWQ's, not only loom's."""
    from compressed_tensors.entrypoints.convert.converters.autoawq import AutoAWQConverter
    from safetensors.torch import load_file
    path, _, _ = checkpoints("llama-asym")
    awq = as_awq(path, str(tmp_path / "awq"), GROUP, AWQ_DENSE)
    converter = AutoAWQConverter.from_autoawq_config(
        json.loads((Path(awq) / "config.json").read_text())["quantization_config"])
    back = converter.process(load_file(Path(awq) / "model.safetensors"))
    original = load_file(Path(path) / "model.safetensors")
    assert sorted(back) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(back[name].to(tensor.dtype), tensor), name


def test_awq_checkpoint(checkpoints, tmp_path):
    path, reference, unquantized = checkpoints("llama-asym")
    awq = as_awq(path, str(tmp_path / "awq"), GROUP, AWQ_DENSE)
    _check_against(_llm(awq, quantization="awq_marlin"), reference, unquantized)


@pytest.mark.parametrize("case", ["qwen3-sym", "qwen2-sym-channel"])
def test_gptq_checkpoint(case, checkpoints, tmp_path):
    path, reference, unquantized = checkpoints(case)
    gptq = as_gptq(path, str(tmp_path / "gptq"), CASES[case][1])
    _check_against(_llm(gptq), reference, unquantized)


@pytest.mark.parametrize("case", ["llama-asym", "qwen3-sym"])
def test_tensor_parallel(case, checkpoints, tmp_path):
    """TP=2 on gloo: column-parallel ranks keep their rows of the packed weights, scales and
    zero points (packed along the rows in compressed-tensors' checkpoint), row-parallel
    ones their whole groups of input features. Weight-only int4 computes what TP=1 does."""
    path, reference, unquantized = checkpoints(case)
    if case == "qwen3-sym":
        path = as_gptq(path, str(tmp_path / "gptq"), GROUP)
    else:
        path = as_awq(path, str(tmp_path / "awq"), GROUP, AWQ_DENSE)
    _check_against(_llm(path, tensor_parallel_size=2), reference, unquantized)


def test_compiled_level_3(checkpoints):
    path, reference, unquantized = checkpoints("qwen3-sym")
    _check_against(_llm(path, compilation_config=3), reference, unquantized)


def test_lora_over_int4_layers_matches_peft(checkpoints, tmp_path):
    """An adapter's term is added to the int4 matmul's output, as peft adds it over
    compressed-tensors' quantized Linear (the adapter made on the unquantized model)."""
    import copy

    import peft

    from loom.lora.request import LoRARequest
    from tests.lora_util import make_adapter
    path, reference, _ = checkpoints("qwen3-sym")
    adapter = str(tmp_path / "adapter")
    make_tiny_model("qwen3", str(tmp_path / "base"))  # the checkpoint's model, unquantized
    make_adapter(str(tmp_path / "base"), adapter)
    peft_model = peft.PeftModel.from_pretrained(copy.deepcopy(reference), adapter).eval()
    llm = _llm(path, enable_lora=True)
    try:
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
        outs = llm.generate(PROMPTS, params, use_tqdm=False,
                            lora_request=LoRARequest("a", 1, adapter))
    finally:
        llm.shutdown()
    for prompt, out in zip(PROMPTS, outs):
        assert out.outputs[0].token_ids == hf_greedy(peft_model, prompt, NEW_TOKENS)
        assert out.outputs[0].token_ids != hf_greedy(reference, prompt, NEW_TOKENS)


@pytest.mark.parametrize("compilation", [0, 3])
def test_act_order_gptq(compilation, tmp_path):
    """desc_act: each layer's input features quantized in groups taken in a random order
    (g_idx); loom sorts the packed columns by group and permutes the input to match."""
    from tests.quantization.int4_checkpoints import write_act_order_gptq
    path = str(tmp_path / "gptq")
    model = make_tiny_model("llama", str(tmp_path / "base"))
    reference = write_act_order_gptq(model, path, GROUP)
    _check_against(_llm(path, compilation_config=compilation), reference, model.eval())


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    """qwen3_moe with int4 experts (groups of 16: down's 32 input features split at TP=2),
    zero points; its reference and the unquantized model."""
    from tests.quantization.int4_checkpoints import write_int4_moe_checkpoint
    base, path = (str(tmp_path_factory.mktemp(n)) for n in ("moe-base", "moe-int4"))
    reference = write_int4_moe_checkpoint(make_tiny_model("qwen3_moe", base), path, 16, False)
    return path, reference, make_tiny_model("qwen3_moe", base)


@pytest.mark.parametrize("kwargs", [{}, {"tensor_parallel_size": 2},
                                    {"compilation_config": 3}], ids=["tp1", "tp2", "level3"])
def test_int4_moe_experts(kwargs, moe_checkpoint):
    """Every expert's gate, up and down in int4 (the checkpoint's per-expert tensors), as
    compressed-tensors quantizes them; at TP=2 each rank holds its rows of gate and up and
    its groups of down's input features."""
    path, reference, unquantized = moe_checkpoint
    _check_against(_llm(path, **kwargs), reference, unquantized)


@pytest.mark.parametrize("layout", ["compressed-tensors", "gptq"])
def test_8_bit_weights(layout, tmp_path):
    """W8A16 (compressed-tensors) and GPTQ-Int8: four values a word, zero points of 128."""
    base = str(tmp_path / "base")
    path = str(tmp_path / "w8a16")
    unquantized = make_tiny_model("qwen3", base)
    reference = write_int4_checkpoint(make_tiny_model("qwen3", base), path, GROUP, True,
                                      ["lm_head"], bits=8)
    if layout == "gptq":
        path = as_gptq(path, str(tmp_path / "gptq"), GROUP, bits=8)
    _check_against(_llm(path), reference, unquantized.eval())


def test_8_bit_moe_experts(tmp_path):
    from tests.quantization.int4_checkpoints import write_int4_moe_checkpoint
    base, path = str(tmp_path / "base"), str(tmp_path / "w8")
    unquantized = make_tiny_model("qwen3_moe", base)
    reference = write_int4_moe_checkpoint(make_tiny_model("qwen3_moe", base), path, 16, False,
                                          bits=8)
    _check_against(_llm(path), reference, unquantized.eval())


def test_gptq_moe_experts(tmp_path):
    """Qwen3-MoE's GPTQ layout: every expert's qweight, scales, qzeros (all 8, only checked)
    and g_idx."""
    from tests.quantization.int4_checkpoints import write_int4_moe_checkpoint
    base, path = str(tmp_path / "base"), str(tmp_path / "ct")
    unquantized = make_tiny_model("qwen3_moe", base)
    reference = write_int4_moe_checkpoint(make_tiny_model("qwen3_moe", base), path, 16, True)
    gptq = as_gptq(path, str(tmp_path / "gptq"), 16)
    _check_against(_llm(gptq, tensor_parallel_size=2), reference, unquantized.eval())
