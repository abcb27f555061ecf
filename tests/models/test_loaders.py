"""Loaders beyond the single-file checkpoint: sharded safetensors and dummy weights."""

from __future__ import annotations

import json

import pytest
import torch

from loom import LLM, SamplingParams
from loom.config import EngineConfig, ModelConfig
from loom.worker.model_loader import load_model

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def test_sharded_checkpoint_loads_like_the_single_file(tiny_model_factory, tmp_path):
    path, hf = tiny_model_factory("qwen3")
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    prompts = [[5, 6, 7, 8], [9] * 12]
    single = LLM(path, skip_tokenizer_init=True, device="cpu", max_model_len=64)
    sharded = LLM(str(tmp_path), skip_tokenizer_init=True, device="cpu", max_model_len=64)
    assert [o.outputs[0].token_ids for o in single.generate(prompts, GREEDY, use_tqdm=False)] == \
        [o.outputs[0].token_ids for o in sharded.generate(prompts, GREEDY, use_tqdm=False)]
    shard = sorted(tmp_path.glob("*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ValueError, match="missing"):
        LLM(str(tmp_path), skip_tokenizer_init=True, device="cpu")


def _dummy_state(path: str, seed: int) -> dict[str, torch.Tensor]:
    config = EngineConfig(ModelConfig(model=path, load_format="dummy", seed=seed))
    model, _, _ = load_model(config, torch.device("cpu"))
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_dummy_weights_are_deterministic_under_seed(tiny_model_factory):
    path, _ = tiny_model_factory("llama")
    a, b, c = _dummy_state(path, 1), _dummy_state(path, 1), _dummy_state(path, 2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert all(v.abs().max() > 0 for v in a.values())


def test_shipped_benchmark_config_builds_with_dummy_weights():
    config = EngineConfig(ModelConfig(model="llama-3.1-8b", load_format="dummy"))
    from loom.models.arch import ModelArch
    from loom.models.loader import resolve
    arch = ModelArch.from_hf_config(resolve(config.model).hf_config)
    assert (arch.num_layers, arch.hidden_size, arch.num_kv_heads) == (32, 4096, 8)
    assert arch.rope_scaling["rope_type"] == "llama3"


@pytest.mark.parametrize("fmt", ["safetensors", "dummy"])
def test_a_gguf_file_under_another_load_format_says_so(tmp_path, fmt):
    from loom.models.loader import resolve
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ValueError, match=f"load_format: '{fmt}' does not apply to the GGUF file "
                                         ".*use --load-format gguf"):
        resolve(ModelConfig(model=str(gguf), load_format=fmt))


def test_a_directory_under_load_format_gguf_says_so(tiny_model_factory):
    from loom.models.loader import resolve
    path, _ = tiny_model_factory("llama")
    with pytest.raises(ValueError, match=f"load_format: 'gguf' needs a .gguf file, and {path} is "
                                         "a directory"):
        resolve(ModelConfig(model=path, load_format="gguf"))
