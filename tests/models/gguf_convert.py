"""A Hugging Face checkpoint written as llama.cpp's converter (convert_hf_to_gguf.py) writes
it, for tests: the gguf package's own tensor name map (llama.cpp's), its metadata keys, and
the converter's changes to the tensors (Llama's q/k row order, stacked experts, Gemma's norm
offset, Phi-3's rope factors, Llama 3's rope_freqs). Nothing here comes from loom."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import MODEL_ARCH
from safetensors.torch import load_file

ARCHS = {"LlamaForCausalLM": MODEL_ARCH.LLAMA, "MixtralForCausalLM": MODEL_ARCH.LLAMA,
         "Qwen2ForCausalLM": MODEL_ARCH.QWEN2, "Qwen3ForCausalLM": MODEL_ARCH.QWEN3,
         "Qwen2MoeForCausalLM": MODEL_ARCH.QWEN2MOE, "Qwen3MoeForCausalLM": MODEL_ARCH.QWEN3MOE,
         "Phi3ForCausalLM": MODEL_ARCH.PHI3, "Gemma2ForCausalLM": MODEL_ARCH.GEMMA2,
         "Gemma3ForCausalLM": MODEL_ARCH.GEMMA3}
_EXPERT_PARTS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """The reordering llama.cpp's converter applies to Llama's q_proj / k_proj rows."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def _rope(config: dict) -> tuple[float, dict]:
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    params = dict(params.get("full_attention", params))
    return float(params.get("rope_theta") or config.get("rope_theta") or 10000.0), params


def _llama3_rope_freqs(config: dict, head_dim: int) -> np.ndarray:
    """llama.cpp's rope_freqs for a llama3 rope: each frequency's divisor."""
    theta, p = _rope(config)
    old, low, high = (p["original_max_position_embeddings"], p["low_freq_factor"],
                      p["high_freq_factor"])
    factors = []
    for freq in 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(p["factor"])
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / p["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


def _metadata(w: gguf.GGUFWriter, config: dict, kind: str) -> None:
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    theta, rope = _rope(config)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_block_count(config["num_hidden_layers"])
    w.add_head_count(heads)
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(theta)
    w.add_vocab_size(config["vocab_size"])
    w.add_bos_token_id(config["bos_token_id"])
    w.add_eos_token_id(config["eos_token_id"])
    if kind == "llama":
        w.add_rope_dimension_count(head_dim)
    elif config.get("head_dim"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    experts = config.get("num_local_experts") or config.get("num_experts")
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(config["num_experts_per_tok"])
        if config.get("moe_intermediate_size"):
            w.add_expert_feed_forward_length(config["moe_intermediate_size"])
        if config.get("shared_expert_intermediate_size"):
            w.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    if kind.startswith("gemma"):
        w.add_sliding_window(config["sliding_window"])
        if config.get("attn_logit_softcapping"):
            w.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        if config.get("final_logit_softcapping"):
            w.add_final_logit_softcapping(config["final_logit_softcapping"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if rope.get("rope_type") == "yarn":  # as llama.cpp's converter writes Qwen's
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if kind == "phi3":
        original = config["original_max_position_embeddings"]
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_dimension_count(head_dim)
        w.add_sliding_window(config.get("sliding_window") or 0)
        scale = config["max_position_embeddings"] / original
        w.add_rope_scaling_attn_factors(
            math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)


def _stack_experts(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert tensors as the converter stacks them, [experts, rows, columns], under the
    names gguf's map knows (model.layers.N.mlp.experts.gate_proj.weight)."""
    out, stacks = {}, {}
    for name, tensor in tensors.items():
        parts = name.split(".")
        if "experts" not in parts or name.startswith("lm_head"):
            out[name] = tensor
            continue
        i = parts.index("experts")
        expert, proj = int(parts[i + 1]), _EXPERT_PARTS.get(parts[i + 2], parts[i + 2])
        key = ".".join(parts[:2] + [parts[2], "mlp", "experts", proj, parts[-1]])
        stacks.setdefault(key, {})[expert] = tensor
    for key, experts in stacks.items():
        out[key] = torch.stack([experts[e] for e in sorted(experts)])
    return out


def convert(hf_dir: str | Path, out: str | Path, qtype: Q | None = None) -> Path:
    """Write hf_dir's model.safetensors and config.json as a GGUF file; qtype quantizes the
    2-D and 3-D weights (embeddings, projections, experts), F32 otherwise."""
    hf_dir = Path(hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    arch = ARCHS[config["architectures"][0]]
    kind = gguf.MODEL_ARCH_NAMES[arch]
    tensors = _stack_experts(load_file(str(hf_dir / "model.safetensors")))
    names = gguf.get_tensor_name_map(arch, config["num_hidden_layers"])
    w = gguf.GGUFWriter(str(out), kind)
    _metadata(w, config, kind)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    for hf_name, tensor in tensors.items():
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        array = tensor.float().numpy()
        if kind == "llama" and hf_name.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, heads)
        elif kind == "llama" and hf_name.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, kv_heads)
        elif kind.startswith("gemma") and hf_name.endswith("norm.weight"):
            array = array + 1
        elif hf_name.endswith("shared_expert_gate.weight"):
            array = array.reshape(-1)  # llama.cpp's shape: a vector
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, hf_name
        raw = None
        if qtype is not None and array.ndim >= 2:
            array, raw = gguf.quants.quantize(np.ascontiguousarray(array), qtype), qtype
        w.add_tensor(name, np.ascontiguousarray(array), raw_dtype=raw)
    _, rope = _rope(config)
    if rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_rope_freqs(config, head_dim))
    if kind == "phi3" and rope.get("long_factor"):
        for which in ("long", "short"):
            w.add_tensor(f"rope_factors_{which}.weight",
                         np.array(rope[f"{which}_factor"], dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)
