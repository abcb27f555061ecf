"""Which int4 weight-only (W4A16) configs loom runs, as AutoAWQ, GPTQ and llm-compressor
write them, and the field it names when it refuses one."""

from __future__ import annotations

import copy

import pytest

from loom.quantization.config import quant_scheme
from loom.quantization.int4_config import Int4Scheme

W4A16 = {  # as llm-compressor writes a W4A16 (GPTQModifier, scheme "W4A16") checkpoint's config
    "quant_method": "compressed-tensors", "format": "pack-quantized",
    "quantization_status": "compressed", "ignore": ["lm_head"], "kv_cache_scheme": None,
    "sparsity_config": {}, "transform_config": {},
    "config_groups": {"group_0": {
        "targets": ["Linear"], "format": "pack-quantized", "input_activations": None,
        "output_activations": None,
        "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                    "symmetric": True, "dynamic": False, "actorder": None}}},
}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
       "version": "gemm", "modules_to_not_convert": ["visual"]}  # Qwen2.5-VL-AWQ's
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True,
        "damp_percent": 0.01, "static_groups": False, "true_sequential": True,
        "model_name_or_path": None, "model_file_base_name": "model"}  # Qwen2.5 GPTQ-Int4's


def _ct(change) -> dict:
    qc = copy.deepcopy(W4A16)
    change(qc, qc["config_groups"]["group_0"])
    return {"quantization_config": qc}


def _cfg(base: dict, **change) -> dict:
    return {"quantization_config": {**base, **change}}


def test_schemes_read():
    assert quant_scheme({"quantization_config": W4A16}, None) == Int4Scheme(
        "compressed-tensors", 128, False, ("lm_head",))
    asym = quant_scheme(_ct(lambda qc, g: g["weights"].update(symmetric=False)),
                        "compressed-tensors")
    assert (asym.group_size, asym.zero_point) == (128, True)
    channel = quant_scheme(_ct(lambda qc, g: g["weights"].update(strategy="channel",
                                                                 group_size=None)), None)
    assert channel.group_size is None
    awq = quant_scheme({"quantization_config": AWQ}, "awq_marlin")
    assert (awq.method, awq.group_size, awq.zero_point) == ("awq", 128, True)
    assert awq.ignores("lm_head") and awq.ignores("model.visual.blocks.0.attn.qkv")
    assert not awq.ignores("model.layers.0.self_attn.q_proj")
    gptq = quant_scheme(_cfg(GPTQ, group_size=-1), "gptq")
    assert (gptq.method, gptq.group_size, gptq.zero_point) == ("gptq", None, False)
    assert "int4 weights (gptq, a scale per output channel, symmetric)" in gptq.describe()
    assert quant_scheme(_cfg(GPTQ, desc_act=True), None).act_order
    assert not quant_scheme(_cfg(GPTQ, desc_act=True, group_size=-1), None).act_order
    assert not gptq.act_order and not awq.act_order
    int8 = quant_scheme(_cfg(GPTQ, bits=8), None)  # GPTQ-Int8
    assert int8.bits == 8 and "int8 weights (gptq" in int8.describe()
    assert int8.bytes_per_weight(2) == 1 + 2 / 128
    w8a16 = quant_scheme(_ct(lambda qc, g: g["weights"].update(num_bits=8)), None)
    assert (w8a16.bits, w8a16.group_size) == (8, 128)


@pytest.mark.parametrize("config, field", [
    (_cfg(AWQ, bits=8), r"quantization_config\.bits: 8-bit"),
    (_cfg(AWQ, version="gemv"), r"quantization_config\.version: 'gemv'"),
    (_cfg(AWQ, group_size=100), r"quantization_config\.group_size: 100"),
    (_cfg(GPTQ, sym=False), r"quantization_config\.sym: asymmetric GPTQ"),
    (_cfg(GPTQ, lm_head=True), r"quantization_config\.lm_head"),
    (_cfg(GPTQ, checkpoint_format="marlin"), r"quantization_config\.checkpoint_format"),
    (_ct(lambda qc, g: g["weights"].update(num_bits=3)), r"group_0\.weights\.num_bits: 3-bit"),
    (_cfg(GPTQ, bits=2), r"quantization_config\.bits: 2-bit weights are not supported; loom "
                         r"runs 4 or 8-bit"),
    (_ct(lambda qc, g: g["weights"].update(actorder="group")), r"group_0\.weights\.actorder"),
    (_ct(lambda qc, g: g["weights"].update(strategy="tensor")), r"group_0\.weights\.strategy"),
    (_ct(lambda qc, g: g["weights"].update(type="float")), r"group_0\.weights\.type"),
    (_ct(lambda qc, g: g.update(input_activations={"num_bits": 8})),
     r"group_0\.input_activations: int4 weights run with unquantized activations"),
    (_ct(lambda qc, g: g.update(targets=["re:.*mlp.*"])), r"group_0\.targets"),
    (_ct(lambda qc, g: qc["config_groups"].update(group_1={**g, "format": "float-quantized"})),
     r"pack-quantized \(int\) groups beside other formats"),
    (_ct(lambda qc, g: qc["config_groups"].update(
        group_1={**g, "weights": {**g["weights"], "group_size": 64}})),
     r"different group sizes"),
])
def test_refusals_name_the_field(config, field):
    with pytest.raises(ValueError, match=field):
        quant_scheme(config, None)


def test_requested_method_must_be_the_checkpoints():
    with pytest.raises(ValueError, match=r"'gptq' differs from the checkpoint's "
                                         r"quantization_config.quant_method \('awq'\)"):
        quant_scheme({"quantization_config": AWQ}, "gptq_marlin")
    with pytest.raises(ValueError, match=r"'awq' names a checkpoint format, and the model's "
                                         r"config.json has no quantization_config"):
        quant_scheme({}, "awq")
