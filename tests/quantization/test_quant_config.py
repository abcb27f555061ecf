"""Which quantization configs loom runs, and the field it names when it refuses one."""

from __future__ import annotations

import copy

import pytest

from loom.engine.arg_utils import EngineArgs
from loom.quantization.config import Fp8Scheme, quant_scheme

FP8_DYNAMIC = {  # as llm-compressor writes an FP8_DYNAMIC checkpoint's config
    "quant_method": "compressed-tensors", "format": "float-quantized",
    "quantization_status": "compressed", "ignore": ["lm_head"], "kv_cache_scheme": None,
    "sparsity_config": {}, "transform_config": {},
    "config_groups": {"group_0": {
        "targets": ["Linear"], "format": "float-quantized", "output_activations": None,
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True,
                    "dynamic": False, "group_size": None},
        "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                              "symmetric": True, "dynamic": True, "group_size": None}}},
}


def _with(change, base=FP8_DYNAMIC) -> dict:
    qc = copy.deepcopy(base)
    change(qc, qc["config_groups"]["group_0"])
    return {"quantization_config": qc}


FP8_BLOCK = _with(lambda qc, g: (  # as llm-compressor writes an FP8_BLOCK checkpoint's config
    g["weights"].update(strategy="block", block_structure=[128, 128]),
    g["input_activations"].update(strategy="group", group_size=128)))["quantization_config"]
W8A8_INT8 = _with(lambda qc, g: (  # as llm-compressor writes a W8A8 (int8) checkpoint's config
    qc.update(format="int-quantized"), g.update(format="int-quantized"),
    g["weights"].update(type="int"), g["input_activations"].update(type="int")))[
    "quantization_config"]
QWEN3_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
             "weight_block_size": [128, 128]}  # Qwen3-8B-FP8's config.json


def test_schemes_read():
    s = quant_scheme({"quantization_config": FP8_DYNAMIC}, None)
    assert (s.method, s.weights_in_checkpoint, s.activations) == ("compressed-tensors", True, "token")
    assert s.ignores("lm_head") and not s.ignores("model.layers.0.mlp.down_proj")
    s = quant_scheme({}, "fp8")
    assert (s.weights_in_checkpoint, s.activations, s.ignore) == (False, "token", ())
    assert quant_scheme({}, None) is None
    s = quant_scheme({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static",
                                              "ignored_layers": ["re:.*gate$"]}}, "fp8")
    assert (s.activations, s.ignores("model.layers.3.mlp.gate")) == ("static", True)
    static = _with(lambda qc, g: g["input_activations"].update(strategy="tensor", dynamic=False))
    assert quant_scheme(static, "compressed-tensors").activations == "static"


def test_int8_schemes_read():
    s = quant_scheme({"quantization_config": W8A8_INT8}, "compressed-tensors")
    assert (s.dtype, s.activations, s.weight_block) == ("int8", "token", None)
    assert s.describe() == ("int8 weights (from the checkpoint), activations dynamic per token")
    static = _with(lambda qc, g: g["input_activations"].update(strategy="tensor", dynamic=False),
                   W8A8_INT8)
    assert (quant_scheme(static, None).dtype, quant_scheme(static, None).activations) == (
        "int8", "static")
    naive = _with(lambda qc, g: (qc.update(format="naive-quantized"), g.pop("format")), W8A8_INT8)
    assert quant_scheme(naive, None).dtype == "int8"
    assert quant_scheme({"quantization_config": FP8_DYNAMIC}, None).dtype == "fp8"


@pytest.mark.parametrize("change, field", [
    (lambda qc, g: g["input_activations"].update(symmetric=False),
     r"group_0\.input_activations\.symmetric: False; loom runs int8"),
    (lambda qc, g: g["weights"].update(symmetric=False), r"group_0\.weights\.symmetric"),
    (lambda qc, g: g["input_activations"].update(type="float"),
     r"group_0\.input_activations\.type: 'float'; loom runs int8"),
    (lambda qc, g: g["weights"].update(strategy="group", group_size=128),
     r"group_0\.weights\.strategy: 'group' is not one of channel, tensor$"),
    (lambda qc, g: g["input_activations"].update(strategy="group", group_size=128),
     r"group_0\.input_activations\.strategy: 'group' is not one of token, tensor$"),
    (lambda qc, g: g.update(format="float-quantized"), r"group_0\.format: 'float-quantized'"),
    (lambda qc, g: g.update(input_activations=None), r"input_activations: 8-bit weights "
                                                     r"without quantized activations"),
])
def test_int8_refusals_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        quant_scheme(_with(change, W8A8_INT8), None)


def test_block_wise_schemes_read():
    for qc, method in ((FP8_BLOCK, "compressed-tensors"), (QWEN3_FP8, "fp8")):
        s = quant_scheme({"quantization_config": qc}, None)
        assert (s.method, s.activations, s.weight_block) == (method, "group", (128, 128))
        assert "per 128x128 block" in s.describe()
    s = quant_scheme({"quantization_config": dict(QWEN3_FP8, weight_block_size=[64, 32])}, "fp8")
    assert s.weight_block == (64, 32)
    assert quant_scheme({}, "fp8").weight_block is None  # quantizing at load: per channel


@pytest.mark.parametrize("config, field", [
    (dict(QWEN3_FP8, weight_block_size=[128]), r"weight_block_size: \[128\] is not two"),
    (dict(QWEN3_FP8, weight_block_size=[0, 128]), r"weight_block_size: \[0, 128\]"),
    (dict(QWEN3_FP8, activation_scheme="static"), r"activation_scheme: block-wise fp8"),
    (_with(lambda qc, g: g["input_activations"].update(strategy="token", group_size=None),
           FP8_BLOCK)["quantization_config"],
     r"group_0\.input_activations: block-wise weights \(128x128\) run with dynamic"),
    (_with(lambda qc, g: g["input_activations"].update(group_size=64), FP8_BLOCK)
     ["quantization_config"], r"per group of 128 features .* group_size 64"),
    (_with(lambda qc, g: g["weights"].update(block_structure=None), FP8_BLOCK)
     ["quantization_config"], r"weights\.block_structure: None is not two"),
    (_with(lambda qc, g: g["input_activations"].update(strategy="group", group_size=128))
     ["quantization_config"], r"input_activations\.strategy: 'group' scales go with block"),
    (_with(lambda qc, g: g["weights"].update(block_structure=[128, 128]))
     ["quantization_config"], r"weights\.block_structure: given with strategy 'channel'"),
])
def test_block_wise_refusals_name_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        quant_scheme({"quantization_config": config}, None)


def test_scheme_checks_its_fields():
    with pytest.raises(ValueError, match=r"weight_block: block-wise weights go with"):
        Fp8Scheme("fp8", True, "token", weight_block=(128, 128))
    with pytest.raises(ValueError, match=r"weight_block: block-wise weights go with"):
        Fp8Scheme("fp8", True, "group")
    with pytest.raises(ValueError, match=r"activations: 'tensor' is not one of"):
        Fp8Scheme("fp8", True, "tensor")
    with pytest.raises(ValueError, match=r"dtype: 'int4' is not one of"):
        Fp8Scheme("compressed-tensors", True, "token", dtype="int4")
    with pytest.raises(ValueError, match=r"dtype: int8 weights come from a checkpoint"):
        Fp8Scheme("fp8", False, "token", dtype="int8")


@pytest.mark.parametrize("change, field", [
    (lambda qc, g: g["weights"].update(num_bits=4), r"group_0\.weights\.num_bits"),
    (lambda qc, g: g["weights"].update(type="int"), r"group_0\.format: 'float-quantized'"),
    (lambda qc, g: (g["weights"].update(type="int"), g.update(format="int-quantized")),
     r"group_0\.input_activations\.type: 'float'; loom runs int8"),
    (lambda qc, g: g["weights"].update(strategy="group", group_size=128),
     r"group_0\.weights\.strategy"),
    (lambda qc, g: g.update(input_activations=None), r"input_activations: 8-bit weights "),
    (lambda qc, g: g["input_activations"].update(strategy="token", dynamic=False),
     r"static scales must be per tensor"),
    (lambda qc, g: g.update(format="pack-quantized"), r"group_0\.input_activations: int4"),
    (lambda qc, g: g.update(format="marlin-24"), r"group_0\.format"),
    (lambda qc, g: g.update(targets=["re:.*q_proj"]), r"group_0\.targets"),
    (lambda qc, g: qc.update(kv_cache_scheme={"num_bits": 8}), r"kv_cache_scheme"),
    (lambda qc, g: qc.update(sparsity_config={"format": "sparse-24-bitmask"}),
     r"sparsity_config"),
])
def test_refusals_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        quant_scheme(_with(change), None)


def test_other_methods_and_mismatches_are_refused():
    with pytest.raises(ValueError, match=r"quant_method: 'bitsandbytes' checkpoints are not "):
        quant_scheme({"quantization_config": {"quant_method": "bitsandbytes"}}, None)
    with pytest.raises(ValueError, match=r"quantization: 'fp8' differs from the checkpoint"):
        quant_scheme({"quantization_config": FP8_DYNAMIC}, "fp8")
    with pytest.raises(ValueError, match=r"quantization_config.fmt: 'e5m2'"):
        quant_scheme({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}}, None)
    with pytest.raises(ValueError, match=r"no quantization_config"):
        quant_scheme({}, "compressed-tensors")


def test_engine_args_refuse_an_unknown_method():
    with pytest.raises(ValueError, match=r"quantization: 'bitsandbytes' is not supported; loom "
                                         r"runs fp8, compressed-tensors, awq, gptq"):
        EngineArgs(model="llama-3.1-8b", quantization="bitsandbytes").create_engine_config()
