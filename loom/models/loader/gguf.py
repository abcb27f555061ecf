"""Load a llama.cpp GGUF file as a Hugging Face config dict and float32 weights.

Weights come out under Hugging Face names and layouts, dequantized to float32, so that a
GGUF model runs through the same model code as a safetensors checkpoint (`gguf_arch` says
which architectures, and how each maps). Llama's Q and K projections are un-permuted:
llama.cpp's converter reorders their rows so that its rotary embedding can rotate adjacent
pairs, where Hugging Face's rotates the two halves of a head.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

from loom.models.loader.gguf_arch import GGUFArch, Metadata, dequantized, gguf_arch

WeightIter = Iterator[tuple[str, torch.Tensor]]

# The types loom accepts, where the installed gguf package can dequantize them.
_WANTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                 "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K")


def load_gguf(path: str) -> tuple[dict[str, Any], WeightIter]:
    """Read `path`'s metadata now; the returned iterator dequantizes tensors one at a time."""
    reader = _open(path)
    name, arch = gguf_arch(reader, path)
    config = _hf_config(Metadata(reader, name, path), arch)
    tensors = [t for t in reader.tensors if t.name not in arch.config_tensors]
    names = {t.name: arch.hf_name(t.name, path) for t in tensors}
    for tensor in tensors:
        _check_type(tensor, path)
    return config, _iter_weights(tensors, names, config, arch)


class _Reader(GGUFReader):
    """gguf's reader, slicing a plain ndarray view of its memory map. Slices of numpy's
    memmap subclass each run Python code (`memmap.__array_finalize__`), and the reader takes
    ~1M of them parsing a tokenizer's ~100k strings: SmolLM2's file parsed in 1.8 s, now
    0.55 s. Tensors' `data` come back as plain read-only views of the same mapping."""

    def _get(self, offset: int, dtype: Any, count: int = 1,
             override_order: Any = None) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        dtype, count = np.dtype(dtype), int(count)
        array = plain[offset:offset + dtype.itemsize * count].view(dtype)[:count]
        order = self.byte_order if override_order is None else override_order
        return array.view(array.dtype.newbyteorder(order))


def _open(path: str) -> GGUFReader:
    try:
        return _Reader(path, "r")
    except Exception as e:  # gguf raises assorted errors (ValueError, struct.error, ...)
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


# -- config ----------------------------------------------------------------------------------
def _hf_config(m: Metadata, arch: GGUFArch) -> dict[str, Any]:
    heads = int(m.require("attention.head_count"))
    hidden = int(m.require("embedding_length"))
    # Llama's converter writes the head size as the rotary dimensions; the others as
    # key_length where it is not hidden / heads (Phi-4-mini rotates only part of a head).
    head_dim = m.get("attention.key_length") or (
        m.get("rope.dimension_count") if arch.permute_qk else None) or hidden // heads
    config: dict[str, Any] = {
        "architectures": [arch.architecture],
        "model_type": arch.model_type,
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": int(m.get("feed_forward_length", 0)),
        "num_hidden_layers": int(m.require("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(m.get("attention.head_count_kv", heads)),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(m.get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(m.get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(m.get("context_length", 2048)),
        "vocab_size": _vocab_size(m),
        "tie_word_embeddings": not m.has("output.weight"),
    }
    config.update(_token_ids(m.reader))
    rope_scaling = _rope_scaling(m)
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    arch.configure(m, config)
    return config


def _vocab_size(m: Metadata) -> int:
    size = m.get("vocab_size")
    if size is not None:
        return int(size)
    embed = m.shape("token_embd.weight")
    if embed is None:
        raise ValueError(f"{m.path}: GGUF has neither {m.arch}.vocab_size nor token_embd.weight")
    return int(embed[0])


def _token_ids(reader: GGUFReader) -> dict[str, int]:
    ids = {}
    for name in ("bos_token_id", "eos_token_id"):
        found = reader.fields.get(f"tokenizer.ggml.{name}")
        if found is not None:
            ids[name] = int(found.contents())
    return ids


def _rope_scaling(m: Metadata) -> dict[str, Any] | None:
    meta = m.get
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
                  config: dict[str, Any], arch: GGUFArch) -> WeightIter:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    for tensor in tensors:
        array, name = dequantized(tensor), names[tensor.name]
        if arch.permute_qk and tensor.name.endswith(("attn_q.weight", "attn_q.bias")):
            array = _unpermute(array, heads)
        elif arch.permute_qk and tensor.name.endswith(("attn_k.weight", "attn_k.bias")):
            array = _unpermute(array, kv_heads)
        elif arch.norm_shift and tensor.name.endswith("norm.weight"):
            array -= arch.norm_shift
        elif tensor.name.endswith("ffn_gate_inp_shexp.weight"):
            array = array.reshape(1, -1)  # a vector in GGUF; a one-row Linear's weight
        if "{expert}" in name:
            for expert, rows in enumerate(array):
                yield name.format(expert=expert), torch.from_numpy(rows)
        else:
            yield name, torch.from_numpy(array)


def _unpermute(array: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's per-head reorder of rows: (pairs, 2) back to (2, pairs)."""
    rows = array.shape[0]
    rest = array.shape[1:]
    grouped = array.reshape(num_heads, rows // num_heads // 2, 2, *rest)
    return np.ascontiguousarray(grouped.swapaxes(1, 2).reshape(array.shape))
