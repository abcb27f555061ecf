"""vLLM's loading flags: --hf-config-path, --ignore-patterns, --safetensors-load-strategy and
--lora-dtype, on a tiny Llama checked against transformers."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from loom import LLM, SamplingParams
from loom.config import ModelConfig
from tests.conftest import hf_greedy

PROMPT = [5, 17, 99, 3, 42]
GREEDY = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)


def _llm(path: str, **kwargs) -> LLM:
    kwargs.setdefault("max_model_len", 128)
    return LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu", **kwargs)


def _tokens(llm: LLM) -> list[int]:
    try:
        return llm.generate([PROMPT], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    finally:
        llm.shutdown()


@pytest.fixture
def checkpoint(tiny_model_factory, tmp_path):
    path, hf = tiny_model_factory("llama")
    copy = tmp_path / "model"
    shutil.copytree(path, copy)
    return copy, hf


def test_hf_config_path_is_read_in_place_of_the_models(checkpoint, tmp_path):
    path, hf = checkpoint
    other = tmp_path / "other-config"
    other.mkdir()
    config = json.loads((path / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 96}))
    for named in (other, other / "config.json"):  # a directory or the file
        llm = _llm(str(path), max_model_len=None, hf_config_path=str(named))
        assert llm.engine.get_model_info()["max_model_len"] == 96
        assert _tokens(llm) == hf_greedy(hf, PROMPT, 5)  # the weights are the model's
    with pytest.raises(ValueError, match="hf_config_path: .* is neither a config.json"):
        _llm(str(path), hf_config_path=str(tmp_path / "nowhere"))


def test_ignore_patterns_keep_files_out_of_loading(checkpoint):
    path, hf = checkpoint
    save_file({"stray.weight": torch.zeros(2)}, str(path / "extra-stray.safetensors"))
    with pytest.raises(ValueError, match="'stray.weight' matches no parameter"):
        _llm(str(path))
    assert _tokens(_llm(str(path), ignore_patterns=["extra-*"])) == hf_greedy(hf, PROMPT, 5)
    # An index that lists Llama's original/ copy: skipped by default, as in vLLM.
    (path / "extra-stray.safetensors").unlink()
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    weight_map = {n: "model.safetensors" for n in names}
    weight_map["original.stray"] = "original/consolidated.safetensors"
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert _tokens(_llm(str(path))) == hf_greedy(hf, PROMPT, 5)
    with pytest.raises(ValueError, match="weight files listed in .* are missing"):
        _llm(str(path), ignore_patterns=[])
    with pytest.raises(ValueError, match="no \\*.safetensors weight files .* but those "
                                         "--ignore-patterns skips"):
        (path / "model.safetensors.index.json").unlink()
        _llm(str(path), ignore_patterns=["*.safetensors"])
    with pytest.raises(ValueError, match="ignore_patterns: expected a list of names"):
        ModelConfig("m", ignore_patterns=[3])


def test_eager_safetensors_loading_gives_the_same_model(checkpoint):
    path, hf = checkpoint
    llm = _llm(str(path), safetensors_load_strategy="eager")
    assert _tokens(llm) == hf_greedy(hf, PROMPT, 5)
    with pytest.raises(ValueError, match="safetensors_load_strategy: 'torchao' is not one of"):
        ModelConfig("m", safetensors_load_strategy="torchao")


def test_lora_dtype_is_the_models(checkpoint):
    path, _ = checkpoint
    llm = _llm(str(path), enable_lora=True, lora_dtype="float32")
    llm.shutdown()
    with pytest.raises(ValueError, match="lora_dtype: loom's LoRA layers compute in the "
                                         "model's dtype \\(float32\\); give auto or float32, "
                                         "got 'bfloat16'"):
        _llm(str(path), enable_lora=True, lora_dtype="bfloat16")
    with pytest.raises(ValueError, match="lora_dtype: 'int8' is not one of"):
        _llm(str(path), enable_lora=True, lora_dtype="int8")


def test_the_flags_reach_the_engine_config(monkeypatch, tmp_path):
    from loom.cli import main
    from loom.entrypoints.openai import launcher
    from loom.models.names import shipped_config
    seen = {}
    monkeypatch.setattr(launcher, "run_server",
                        lambda options, config, inproc: seen.update(config=config))
    config = str(shipped_config("llama-3.1-8b"))
    main(["serve", "llama-3.1-8b", "--load-format", "dummy", "--device", "cpu",
          "--hf-config-path", config, "--ignore-patterns", "a*", "b/**",
          "--safetensors-load-strategy", "eager", "--enable-lora", "--lora-dtype", "bfloat16",
          "--logits-processors", "tests.engine.logits_procs:TargetToken"])
    model = seen["config"].model
    assert (model.hf_config_path, model.ignore_patterns, model.safetensors_load_strategy,
            seen["config"].lora.lora_dtype, model.logits_processors) == (
        config, ("a*", "b/**"), "eager", "bfloat16", ("tests.engine.logits_procs:TargetToken",))
    main(["serve", "llama-3.1-8b", "--load-format", "dummy", "--device", "cpu"])
    assert seen["config"].model.ignore_patterns == ("original/**/*",)


def test_disable_sliding_window_caps_the_context_at_the_window(tiny_model_factory):
    """vLLM's --disable-sliding-window: Gemma 2's window (16 tokens here) becomes its
    context length, within which its tokens are transformers'; a model without a window is
    left as it is."""
    path, hf = tiny_model_factory("gemma2")
    llm = _llm(path, max_model_len=None, disable_sliding_window=True)
    try:
        assert llm.engine.get_model_info()["max_model_len"] == 16
        prompt = PROMPT + [7, 8, 9, 10, 11]
        out = llm.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        assert out == hf_greedy(hf, prompt, 5)
        with pytest.raises(ValueError, match="prompt"):
            llm.generate([PROMPT * 4], GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
    with pytest.raises(ValueError, match="max_model_len: 64 exceeds the model's context "
                                         "length \\(16\\)"):
        _llm(path, max_model_len=64, disable_sliding_window=True)
    plain = _llm(tiny_model_factory("llama")[0], max_model_len=None, disable_sliding_window=True)
    assert plain.engine.get_model_info()["max_model_len"] == 512
    plain.shutdown()
