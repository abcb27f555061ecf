"""loom's GGUF loader against transformers' on SmolLM2, and on tiny GGUF files made here."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from loom.models.loader.gguf import _Reader, load_gguf
from tests.models.gguf_convert import llama_cpp_permute

CONFIG_FIELDS = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "rms_norm_eps", "max_position_embeddings", "vocab_size",
                 "head_dim", "tie_word_embeddings", "bos_token_id", "eos_token_id", "model_type"]


@pytest.fixture(scope="module")
def smol_loaded(smol_gguf: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    config, weights = load_gguf(smol_gguf)
    return config, dict(weights)


@pytest.mark.slow
def test_smollm2_weights_equal_transformers(smol_hf_checkpoint: Any, smol_loaded: Any) -> None:
    hf_config, hf_tensors, model_names = smol_hf_checkpoint
    config, weights = smol_loaded
    assert set(weights) == set(hf_tensors)
    # Every parameter of the model is covered; the LM head only when it is not tied.
    assert hf_config.tie_word_embeddings and config["tie_word_embeddings"]
    assert set(weights) == model_names - {"lm_head.weight"}
    for name, expected in hf_tensors.items():
        got = weights[name]
        assert got.dtype == torch.float32 and got.shape == expected.shape, name
        assert torch.equal(got, expected), name


@pytest.mark.slow
def test_smollm2_config_equals_transformers(smol_hf_checkpoint: Any, smol_loaded: Any) -> None:
    hf_config, _, _ = smol_hf_checkpoint
    config, _ = smol_loaded
    for field in CONFIG_FIELDS:
        assert config[field] == getattr(hf_config, field), field
    rope = getattr(hf_config, "rope_parameters", None) or {"rope_theta": hf_config.rope_theta}
    assert config["rope_theta"] == rope["rope_theta"]
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["torch_dtype"] == "float32"


# -- tiny GGUF files -------------------------------------------------------------------------
HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 256, 4, 2, 512, 32
HEAD_DIM = HIDDEN // HEADS


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, Q | None]],
               arch: str = "llama", expert_count: int = 0) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    if expert_count:
        writer.add_expert_count(expert_count)
    writer.add_block_count(1)
    writer.add_context_length(4096)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(500000.0)
    writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
    writer.add_rope_scaling_factor(2.0)
    writer.add_vocab_size(VOCAB)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    for name, (array, raw_dtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _random(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _quantized(array: np.ndarray, qtype: Q) -> tuple[np.ndarray, Q]:
    return gguf.quants.quantize(array, qtype), qtype


# HF name, GGUF name, shape, GGUF type: one of each kind of tensor, and each type that the
# gguf package can also quantize (it dequantizes K-quants but cannot make them).
TINY_TENSORS = [
    ("model.embed_tokens.weight", "token_embd.weight", (VOCAB, HIDDEN), Q.Q8_0),
    ("model.layers.0.input_layernorm.weight", "blk.0.attn_norm.weight", (HIDDEN,), Q.F32),
    ("model.layers.0.self_attn.q_proj.weight", "blk.0.attn_q.weight", (HIDDEN, HIDDEN), Q.F32),
    ("model.layers.0.self_attn.k_proj.weight", "blk.0.attn_k.weight",
     (KV_HEADS * HEAD_DIM, HIDDEN), Q.F16),
    ("model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight",
     (KV_HEADS * HEAD_DIM, HIDDEN), Q.Q4_0),
    ("model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight",
     (HIDDEN, HIDDEN), Q.BF16),
    ("model.layers.0.post_attention_layernorm.weight", "blk.0.ffn_norm.weight", (HIDDEN,), Q.F32),
    ("model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight", (FFN, HIDDEN), Q.Q4_1),
    ("model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight", (FFN, HIDDEN), Q.Q5_1),
    ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", (HIDDEN, FFN), Q.Q8_0),
    ("model.norm.weight", "output_norm.weight", (HIDDEN,), Q.F32),
    ("lm_head.weight", "output.weight", (VOCAB, HIDDEN), Q.Q5_0),
]


def _encode(array: np.ndarray, gguf_name: str, qtype: Q) -> tuple[np.ndarray, Q | None]:
    if gguf_name.endswith("attn_q.weight"):
        array = llama_cpp_permute(array, HEADS)
    elif gguf_name.endswith("attn_k.weight"):
        array = llama_cpp_permute(array, KV_HEADS)
    if qtype == Q.F32:
        return array, None
    if qtype == Q.F16:
        return array.astype(np.float16), None
    return _quantized(array, qtype)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    originals = {hf: _random(shape, i) for i, (hf, _, shape, _) in enumerate(TINY_TENSORS)}
    tensors = {g: _encode(originals[hf], g, q) for hf, g, _, q in TINY_TENSORS}
    path = write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", tensors)
    return path, originals


def test_tiny_model_round_trips_every_type(tiny_model: Any) -> None:
    path, originals = tiny_model
    config, weights = load_gguf(str(path))
    weights = dict(weights)
    assert set(weights) == set(originals)
    for hf_name, _, _, qtype in TINY_TENSORS:
        got, want = weights[hf_name].numpy(), originals[hf_name]
        assert got.shape == want.shape and got.dtype == np.float32, hf_name
        if qtype == Q.F32:
            np.testing.assert_array_equal(got, want, err_msg=hf_name)
        else:  # right layout, within the type's quantization error
            error = np.abs(got - want).max() / np.abs(want).max()
            assert error < (0.2 if qtype in (Q.Q4_0, Q.Q4_1) else 0.1), (hf_name, error)


def test_k_quant_blocks_load_with_the_right_shape(tmp_path: Path) -> None:
    # All-zero blocks (scale 0) decode to zeros whatever the format: this checks that K-quant
    # tensors are accepted and their 256-weight blocks land in the right shape.
    kinds = {"token_embd.weight": Q.Q6_K, "blk.0.ffn_down.weight": Q.Q4_K,
             "blk.0.ffn_gate.weight": Q.Q5_K}
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "blk.0.ffn_down.weight": (HIDDEN, FFN),
              "blk.0.ffn_gate.weight": (FFN, HIDDEN)}
    tensors = {}
    for name, qtype in kinds.items():
        rows, cols = shapes[name]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        tensors[name] = (np.zeros((rows, cols // block * size), dtype=np.uint8), qtype)
    _, weights = load_gguf(str(write_gguf(tmp_path / "k.gguf", tensors)))
    loaded = dict(weights)
    assert loaded["model.embed_tokens.weight"].shape == (VOCAB, HIDDEN)
    assert loaded["model.layers.0.mlp.down_proj.weight"].shape == (HIDDEN, FFN)
    assert loaded["model.layers.0.mlp.gate_proj.weight"].shape == (FFN, HIDDEN)
    assert all(not w.any() for w in loaded.values())


def test_tiny_model_config(tiny_model: Any) -> None:
    config, _ = load_gguf(str(tiny_model[0]))
    assert config["num_attention_heads"] == HEADS and config["num_key_value_heads"] == KV_HEADS
    assert config["head_dim"] == HEAD_DIM and config["hidden_size"] == HIDDEN
    assert config["intermediate_size"] == FFN and config["vocab_size"] == VOCAB
    assert config["num_hidden_layers"] == 1 and config["max_position_embeddings"] == 4096
    assert config["rope_theta"] == 500000.0 and config["tie_word_embeddings"] is False
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)


def test_unsupported_quant_type_is_named(tmp_path: Path) -> None:
    # IQ2_XXS: 66 bytes per block of 256 weights; the bytes need not mean anything.
    raw = np.zeros((HIDDEN, HIDDEN // 256 * 66), dtype=np.uint8)
    path = write_gguf(tmp_path / "iq.gguf", {
        "token_embd.weight": (_random((VOCAB, HIDDEN), 0), None),
        "blk.0.attn_q.weight": (raw, Q.IQ2_XXS),
    })
    with pytest.raises(ValueError, match=r"blk\.0\.attn_q\.weight.*IQ2_XXS.*supported: .*Q4_0"):
        load_gguf(str(path))


def test_other_architecture_is_refused(tmp_path: Path) -> None:
    embed = {"token_embd.weight": (_random((VOCAB, HIDDEN), 0), None)}
    path = write_gguf(tmp_path / "gpt2.gguf", embed, arch="gpt2")
    with pytest.raises(ValueError, match="GGUF architecture 'gpt2' is not supported.*qwen3moe"):
        load_gguf(str(path))


def test_missing_metadata_is_named(tmp_path: Path) -> None:
    """llama.cpp writes Mixtral as 'llama' with an expert count: read as Mixtral, whose
    experts-per-token key this file lacks."""
    embed = {"token_embd.weight": (_random((VOCAB, HIDDEN), 0), None)}
    path = write_gguf(tmp_path / "mixtral.gguf", embed, expert_count=8)
    with pytest.raises(ValueError, match=r"mixtral\.gguf: the GGUF metadata has no "
                                         r"llama\.expert_used_count"):
        load_gguf(str(path))


def test_rope_freqs_other_than_llama3s_are_ignored(tmp_path: Path, caplog) -> None:
    # Every frequency halved: no Llama 3 scaling keeps the high ones whole.
    tensors = {"token_embd.weight": (_random((VOCAB, HIDDEN), 0), None),
               "rope_freqs.weight": (np.full(HEAD_DIM // 2, 2.0, dtype=np.float32), None)}
    path = write_gguf(tmp_path / "freqs.gguf", tensors)
    with caplog.at_level(logging.WARNING):
        config, weights = load_gguf(str(path))
    assert config["rope_scaling"] == {"rope_type": "linear", "factor": 2.0}  # the metadata's
    assert "ignoring rope_freqs.weight" in caplog.text
    assert list(dict(weights)) == ["model.embed_tokens.weight"]


def test_unknown_tensor_is_refused(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "odd.gguf", {"blk.0.attn_qkv.weight": (_random((8, 32), 0), None)})
    with pytest.raises(ValueError, match=r"blk\.0\.attn_qkv\.weight"):
        load_gguf(str(path))


@pytest.mark.parametrize("content", [b"", b"not a gguf file at all\n" * 100, b"GGUF\x03\x00"])
def test_not_a_gguf_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        load_gguf(str(path))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="missing.gguf"):
        load_gguf(str(tmp_path / "missing.gguf"))


def _same_reading(ours: gguf.GGUFReader, theirs: gguf.GGUFReader) -> None:
    assert list(ours.fields) == list(theirs.fields)
    for key, want in theirs.fields.items():
        got = ours.fields[key]
        assert (got.offset, got.types, got.data) == (want.offset, want.types, want.data), key
        assert len(got.parts) == len(want.parts), key
        for a, b in zip(got.parts, want.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), key
        assert got.contents() == want.contents(), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for got, want in zip(ours.tensors, theirs.tensors):
        assert (got.tensor_type, got.data_offset, got.n_elements) == (
            want.tensor_type, want.data_offset, want.n_elements), got.name
        assert np.array_equal(got.shape, want.shape), got.name
        assert got.data.dtype == want.data.dtype and np.array_equal(got.data, want.data)
        assert not got.data.flags.writeable, got.name


def test_fast_reader_reads_what_ggufs_reader_reads(smol_gguf: str) -> None:
    """loom's reader (plain views of the memory map) against gguf's own on the demo model:
    every field's parts, indices and contents, every tensor's type, shape and bytes."""
    _same_reading(_Reader(smol_gguf, "r"), gguf.GGUFReader(smol_gguf, "r"))


def test_fast_reader_keeps_a_big_endian_files_order(tmp_path: Path) -> None:
    path = tmp_path / "big.gguf"
    writer = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_block_count(3)
    writer.add_float32("llama.rope.freq_base", 500000.0)
    writer.add_token_list(["a", "bc", "déf"])
    writer.add_tensor("w", np.arange(12, dtype=np.float32).reshape(3, 4))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file,
                 writer.write_tensors_to_file):
        step()
    writer.close()
    ours = _Reader(str(path), "r")
    assert ours.byte_order == "S"  # the file's order is not this machine's
    _same_reading(ours, gguf.GGUFReader(str(path), "r"))
    assert np.array_equal(ours.tensors[0].data, np.arange(12, dtype=np.float32).reshape(3, 4))
    assert ours.fields["llama.block_count"].contents() == 3
    assert ours.fields["tokenizer.ggml.tokens"].contents() == ["a", "bc", "déf"]
