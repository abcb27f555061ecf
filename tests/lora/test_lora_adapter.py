"""Adapters loom cannot apply are refused before any request reaches the engine, each with
a ValueError naming what is wrong; the ones it can are read as PEFT wrote them."""

from __future__ import annotations

import json
import math
import os
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from loom import LLM, SamplingParams
from loom.config import LoRAConfig
from loom.lora.adapter import model_targets, read_adapter
from loom.lora.request import LoRARequest
from tests.lora_util import make_adapter

ARCH = SimpleNamespace(num_heads=4, num_kv_heads=2, head_dim=8, hidden_size=32,
                       intermediate_size=48, num_layers=2, is_moe_layer=lambda i: i == 1,
                       fused_checkpoint=False, interleaved_rope=False, gated_mlp=True,
                       architecture="LlamaForCausalLM")
TARGETS = model_targets(ARCH)


def _write(path, config: dict | None = None, tensors: dict | None = None, r: int = 4):
    os.makedirs(path, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": r, "lora_alpha": 8, "bias": "none",
           "target_modules": ["q_proj", "down_proj"], **(config or {})}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(cfg, f)
    if tensors is None:
        tensors = {"model.layers.0.self_attn.q_proj": (32, 32), "model.layers.0.mlp.down_proj":
                   (32, 48)}
        tensors = {f"base_model.model.{m}.lora_{k}.weight": torch.zeros(
            (r, i) if k == "A" else (o, r)) for m, (o, i) in tensors.items() for k in "AB"}
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    return LoRARequest("x", 1, str(path))


def test_targets_cover_attention_and_dense_mlps_only():
    assert TARGETS["model.layers.0.self_attn.k_proj"] == [16, 32]
    assert TARGETS["model.layers.0.mlp.down_proj"] == [32, 48]
    assert "model.layers.1.mlp.gate_proj" not in TARGETS  # a MoE layer
    assert "model.layers.1.self_attn.o_proj" in TARGETS


def test_phi3_targets_are_its_fused_projections():
    """Phi-3's checkpoint, and so PEFT's adapters for it, has qkv_proj and gate_up_proj."""
    targets = model_targets(SimpleNamespace(**{**vars(ARCH), "fused_checkpoint": True,
                                               "is_moe_layer": lambda i: False}))
    assert targets["model.layers.0.self_attn.qkv_proj"] == [32 + 2 * 16, 32]
    assert targets["model.layers.1.mlp.gate_up_proj"] == [2 * 48, 32]
    assert targets["model.layers.1.mlp.down_proj"] == [32, 48]
    assert not any(t.endswith(("q_proj", "gate_proj")) for t in targets)


def test_reads_a_valid_adapter(tmp_path):
    spec = read_adapter(_write(tmp_path), TARGETS, 16)
    assert spec.rank == 4 and spec.scaling == 2.0
    assert set(spec.modules) == {"model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"}
    spec = read_adapter(_write(tmp_path / "rs", {"use_rslora": True}), TARGETS, 16)
    assert spec.scaling == pytest.approx(8 / math.sqrt(4))


@pytest.mark.parametrize("config, match", [
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
    ({"bias": "all"}, "biases"),
    ({"rank_pattern": {"q_proj": 8}}, "rank_pattern"),
    ({"peft_type": "IA3"}, "peft_type"),
    ({"r": 0}, "r must be a positive integer"),
    ({"lora_alpha": "x"}, "lora_alpha"),
])
def test_refuses_what_it_cannot_apply(tmp_path, config, match):
    with pytest.raises(ValueError, match=match):
        read_adapter(_write(tmp_path, config), TARGETS, 16)


def test_refuses_ranks_above_max_lora_rank(tmp_path):
    with pytest.raises(ValueError, match="rank 4 is above max_lora_rank \\(2\\)"):
        read_adapter(_write(tmp_path), TARGETS, 2)


@pytest.mark.parametrize("tensors, match", [
    ({"base_model.model.lm_head.lora_A.weight": torch.zeros(4, 32)}, "cannot adapt"),
    ({"base_model.model.model.layers.1.mlp.gate_proj.lora_A.weight": torch.zeros(4, 32),
      "base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight": torch.zeros(48, 4)},
     "cannot adapt"),
    ({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 32)},
     "not both A and B"),
    ({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(4, 64),
      "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(32, 4)},
     "the model and rank 4 make them"),
], ids=["lm-head", "moe-layer", "half", "other-model"])
def test_refuses_tensors_it_cannot_place(tmp_path, tensors, match):
    with pytest.raises(ValueError, match=match):
        read_adapter(_write(tmp_path, tensors=tensors), TARGETS, 16)


def test_refuses_missing_files(tmp_path):
    with pytest.raises(ValueError, match="no adapter_config.json"):
        read_adapter(LoRARequest("x", 1, str(tmp_path / "nowhere")), TARGETS, 16)
    request = _write(tmp_path)
    os.rename(tmp_path / "adapter_model.safetensors", tmp_path / "adapter_model.bin")
    with pytest.raises(ValueError, match="adapter_model.bin is not read"):
        read_adapter(request, TARGETS, 16)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lora_name="", lora_int_id=1, lora_path="/p"), "lora_name"),
    (dict(lora_name="a", lora_int_id=0, lora_path="/p"), "lora_int_id"),
    (dict(lora_name="a", lora_int_id=1, lora_path=""), "lora_path"),
])
def test_lora_request_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoRARequest(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(max_loras=0), "max_loras"), (dict(max_lora_rank=-1), "max_lora_rank"),
    (dict(max_loras=2, max_cpu_loras=1), "max_cpu_loras"),
])
def test_lora_config_fields(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoRAConfig(**kwargs)


def test_llm_refuses_bad_lora_requests_before_running_any(tiny_model_factory, tmp_path):
    pytest.importorskip("peft")
    path, _ = tiny_model_factory("llama")
    make_adapter(path, str(tmp_path / "a"), r=8)
    good = LoRARequest("a", 1, str(tmp_path / "a"))
    sp = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    plain = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64)
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        plain.generate([[5, 6]], sp, lora_request=good, use_tqdm=False)
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64,
              enable_lora=True, max_lora_rank=4)
    with pytest.raises(ValueError, match="above max_lora_rank"):
        llm.generate([[5, 6], [7, 8]], sp, lora_request=[None, good], use_tqdm=False)
    with pytest.raises(ValueError, match="lora_request: 1 given for 2 prompts"):
        llm.generate([[5, 6], [7, 8]], sp, lora_request=[good], use_tqdm=False)
    with pytest.raises(ValueError, match="must be a LoRARequest"):
        llm.generate([[5, 6]], sp, lora_request="a", use_tqdm=False)
    # Nothing refused was left behind: the next call runs alone.
    assert len(llm.generate([[5, 6]], sp, use_tqdm=False)[0].outputs[0].token_ids) == 2
    assert not llm.engine.scheduler.has_unfinished_requests()


def test_one_id_names_one_adapter(tiny_model_factory, tmp_path):
    pytest.importorskip("peft")
    path, _ = tiny_model_factory("llama")
    for name in "ab":
        make_adapter(path, str(tmp_path / name), r=4)
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", max_model_len=64,
              enable_lora=True)
    sp = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    llm.generate([[5, 6]], sp, lora_request=LoRARequest("a", 1, str(tmp_path / "a")),
                 use_tqdm=False)
    with pytest.raises(ValueError, match="lora_int_id 1 already names the adapter"):
        llm.generate([[5, 6]], sp, lora_request=LoRARequest("b", 1, str(tmp_path / "b")),
                     use_tqdm=False)
