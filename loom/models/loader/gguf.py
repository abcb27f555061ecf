"""Load a llama.cpp GGUF file as a Hugging Face config dict and float32 weights.

Weights come out under Hugging Face names and layouts, dequantized to float32, so that a
GGUF model runs through the same model code as a safetensors checkpoint. The Q and K
projections are un-permuted: llama.cpp's converter reorders their rows so that its rotary
embedding can rotate adjacent pairs, where Hugging Face's rotates the two halves of a head.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

logger = logging.getLogger(__name__)

WeightIter = Iterator[tuple[str, torch.Tensor]]

# The types loom accepts, where the installed gguf package can dequantize them.
_WANTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                 "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K")

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_GLOBAL_RE = re.compile(r"(\w+)\.(weight|bias)")
# Precomputed Llama 3 rope frequency factors: transformers derives them from the config
# (and ignores this tensor when loading a GGUF), so loom does too.
_SKIPPED = {"rope_freqs.weight"}


def load_gguf(path: str) -> tuple[dict[str, Any], WeightIter]:
    """Read `path`'s metadata now; the returned iterator dequantizes tensors one at a time."""
    reader = _open(path)
    config = _hf_config(reader, path)
    tensors = [t for t in reader.tensors if t.name not in _SKIPPED]
    if len(tensors) < len(reader.tensors):
        logger.warning("%s: ignoring rope_freqs.weight, as transformers does; the rope "
                       "scaling it encodes is not in the GGUF metadata", path)
    names = {t.name: _hf_name(t.name, path) for t in tensors}
    for tensor in tensors:
        _check_type(tensor, path)
    return config, _iter_weights(tensors, names, config)


def _open(path: str) -> GGUFReader:
    try:
        return GGUFReader(path, "r")
    except Exception as e:  # gguf raises assorted errors (ValueError, struct.error, ...)
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


# -- config ----------------------------------------------------------------------------------
def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _hf_config(reader: GGUFReader, path: str) -> dict[str, Any]:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: GGUF architecture {arch!r} is not supported (only 'llama'; "
                         "load other models from their Hugging Face safetensors checkpoint)")

    def meta(key: str, default: Any = None) -> Any:
        return _field(reader, f"llama.{key}", default)

    if meta("expert_count"):
        # llama.cpp writes Mixtral as 'llama' with stacked expert tensors (ffn_*_exps).
        raise ValueError(f"{path}: a mixture-of-experts GGUF (llama.expert_count = "
                         f"{meta('expert_count')}, Mixtral's layout) is not supported; load "
                         "the model's Hugging Face safetensors checkpoint instead")
    heads = int(meta("attention.head_count"))
    hidden = int(meta("embedding_length"))
    head_dim = meta("attention.key_length", meta("rope.dimension_count", hidden // heads))
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": int(meta("feed_forward_length")),
        "num_hidden_layers": int(meta("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta("attention.head_count_kv", heads)),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(meta("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(meta("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(meta("context_length", 2048)),
        "vocab_size": _vocab_size(reader, path),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
        "attention_bias": any(t.name.endswith("attn_q.bias") for t in reader.tensors),
    }
    config.update(_token_ids(reader))
    rope_scaling = _rope_scaling(meta)
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    return config


def _vocab_size(reader: GGUFReader, path: str) -> int:
    size = _field(reader, "llama.vocab_size")
    if size is not None:
        return int(size)
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ValueError(f"{path}: GGUF has neither llama.vocab_size nor token_embd.weight")
    # GGUF shapes are innermost-first: token_embd is [hidden, vocab].
    return int(embed.shape[-1])


def _token_ids(reader: GGUFReader) -> dict[str, int]:
    keys = {"bos_token_id": "tokenizer.ggml.bos_token_id",
            "eos_token_id": "tokenizer.ggml.eos_token_id"}
    values = {name: _field(reader, key) for name, key in keys.items()}
    return {name: int(v) for name, v in values.items() if v is not None}


def _rope_scaling(meta: Any) -> dict[str, Any] | None:
    kind = meta("rope.scaling.type")
    if kind in (None, "none"):
        return None
    scaling: dict[str, Any] = {"rope_type": kind}
    factor = meta("rope.scaling.factor")
    if factor is not None:
        scaling["factor"] = float(factor)
    original = meta("rope.scaling.original_context_length")
    if original is not None:
        scaling["original_max_position_embeddings"] = int(original)
    return scaling


# -- tensors ----------------------------------------------------------------------------------
def _hf_name(name: str, path: str) -> str:
    layer = _LAYER_RE.fullmatch(name)
    if layer and layer.group(2) in _LAYER_NAMES:
        index, part, kind = layer.groups()
        return f"model.layers.{index}.{_LAYER_NAMES[part]}.{kind}"
    whole = _GLOBAL_RE.fullmatch(name)
    if whole and whole.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[whole.group(1)]}.{whole.group(2)}"
    raise ValueError(f"{path}: tensor {name!r} has no Llama counterpart in Hugging Face")


@functools.cache
def supported_types() -> tuple[GGMLQuantizationType, ...]:
    """The wanted types that this gguf package dequantizes, found by trying one block."""
    found = []
    for name in _WANTED_TYPES:
        qtype = GGMLQuantizationType[name]
        block = np.zeros((1, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
        try:
            dequantize(block, qtype)
        except NotImplementedError:
            continue
        found.append(qtype)
    return tuple(found)


def _check_type(tensor: ReaderTensor, path: str) -> None:
    if tensor.tensor_type not in supported_types():
        names = ", ".join(t.name for t in supported_types())
        raise ValueError(f"{path}: tensor {tensor.name!r} has type {tensor.tensor_type.name}, "
                         f"which loom cannot dequantize (supported: {names})")


def _iter_weights(tensors: list[ReaderTensor], names: dict[str, str],
                  config: dict[str, Any]) -> WeightIter:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    for tensor in tensors:
        array = _dequantize(tensor)
        if tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
            array = _unpermute(array, heads)
        elif tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
            array = _unpermute(array, kv_heads)
        yield names[tensor.name], torch.from_numpy(array)


def _dequantize(tensor: ReaderTensor) -> np.ndarray:
    array = dequantize(tensor.data, tensor.tensor_type)
    # GGUF shapes list the innermost dimension first; torch wants it last.
    shape = tuple(int(d) for d in reversed(tensor.shape))
    array = np.asarray(array, dtype=np.float32).reshape(shape)
    # F32 tensors come back as views of the read-only memory map.
    return array if array.flags.writeable and array.flags.c_contiguous else array.copy()


def _unpermute(array: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's per-head reorder of rows: (pairs, 2) back to (2, pairs)."""
    rows = array.shape[0]
    rest = array.shape[1:]
    grouped = array.reshape(num_heads, rows // num_heads // 2, 2, *rest)
    return np.ascontiguousarray(grouped.swapaxes(1, 2).reshape(array.shape))
