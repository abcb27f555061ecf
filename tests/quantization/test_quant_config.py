"""Which quantization configs loom runs, and the field it names when it refuses one."""

from __future__ import annotations

import copy

import pytest

from loom.engine.arg_utils import EngineArgs
from loom.quantization.config import quant_scheme

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


def _with(change) -> dict:
    qc = copy.deepcopy(FP8_DYNAMIC)
    change(qc, qc["config_groups"]["group_0"])
    return {"quantization_config": qc}


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


@pytest.mark.parametrize("change, field", [
    (lambda qc, g: g["weights"].update(num_bits=4), r"group_0\.weights\.num_bits"),
    (lambda qc, g: g["weights"].update(type="int"), r"group_0\.weights\.type"),
    (lambda qc, g: g["weights"].update(strategy="group", group_size=128),
     r"group_0\.weights\.strategy"),
    (lambda qc, g: g.update(input_activations=None), r"input_activations: weight-only"),
    (lambda qc, g: g["input_activations"].update(strategy="token", dynamic=False),
     r"static scales must be per tensor"),
    (lambda qc, g: g.update(format="pack-quantized"), r"group_0\.format"),
    (lambda qc, g: g.update(targets=["re:.*q_proj"]), r"group_0\.targets"),
    (lambda qc, g: qc.update(kv_cache_scheme={"num_bits": 8}), r"kv_cache_scheme"),
    (lambda qc, g: qc.update(sparsity_config={"format": "sparse-24-bitmask"}),
     r"sparsity_config"),
])
def test_refusals_name_the_field(change, field):
    with pytest.raises(ValueError, match=field):
        quant_scheme(_with(change), None)


def test_other_methods_and_mismatches_are_refused():
    with pytest.raises(ValueError, match=r"quant_method: 'awq' checkpoints are not supported"):
        quant_scheme({"quantization_config": {"quant_method": "awq"}}, None)
    with pytest.raises(ValueError, match=r"quantization: 'fp8' differs from the checkpoint"):
        quant_scheme({"quantization_config": FP8_DYNAMIC}, "fp8")
    with pytest.raises(ValueError, match=r"weight_block_size: block-wise"):
        quant_scheme({"quantization_config": {"quant_method": "fp8",
                                              "weight_block_size": [128, 128]}}, None)
    with pytest.raises(ValueError, match=r"no quantization_config"):
        quant_scheme({}, "compressed-tensors")


def test_engine_args_refuse_an_unknown_method():
    with pytest.raises(ValueError, match=r"quantization: 'gptq' is not supported; loom runs "
                                         r"fp8, compressed-tensors"):
        EngineArgs(model="llama-3.1-8b", quantization="gptq").create_engine_config()
