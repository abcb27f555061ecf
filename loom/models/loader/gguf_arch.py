"""The GGUF architectures loom reads: each one's Hugging Face config, built from the metadata
that llama.cpp's converter (convert_hf_to_gguf.py) writes, and its tensors' Hugging Face names.

What the converter leaves out of the metadata (Gemma's query scale and window pattern,
Qwen3-MoE's renormalised top k, which layers are dense) follows what llama.cpp's own model
code assumes for that architecture, or the tensors the file holds.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gguf import GGUFReader, ReaderTensor
from gguf.quants import dequantize

logger = logging.getLogger(__name__)

_LAYER = {
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
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_EXPERTS = {
    "ffn_gate_inp": "mlp.gate",
    # Stacked [experts, rows, columns]: one Hugging Face tensor per expert.
    "ffn_gate_exps": "mlp.experts.{expert}.gate_proj",
    "ffn_up_exps": "mlp.experts.{expert}.up_proj",
    "ffn_down_exps": "mlp.experts.{expert}.down_proj",
}
_SHARED_EXPERT = {
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
_GEMMA_NORMS = {
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_PHI3 = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
# Mixtral as older converters wrote it: one tensor per expert, blk.N.ffn_gate.E.weight.
_OLD_EXPERT_RE = re.compile(r"(ffn_gate|ffn_up|ffn_down)\.(\d+)")


class Metadata:
    """A GGUF file's `{arch}.*` keys and its tensors' shapes (torch's order)."""

    def __init__(self, reader: GGUFReader, arch: str, path: str) -> None:
        self.reader, self.arch, self.path = reader, arch, path
        self.tensors = {t.name: t for t in reader.tensors}

    def get(self, key: str, default: Any = None) -> Any:
        found = self.reader.fields.get(f"{self.arch}.{key}")
        return default if found is None else found.contents()

    def require(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise ValueError(f"{self.path}: the GGUF metadata has no {self.arch}.{key}")
        return value

    def shape(self, name: str) -> tuple[int, ...] | None:
        tensor = self.tensors.get(name)
        return None if tensor is None else tuple(int(d) for d in reversed(tensor.shape))

    def has(self, name: str) -> bool:
        return name in self.tensors


@dataclass(frozen=True)
class GGUFArch:
    architecture: str
    """The Hugging Face class whose config and names the file maps onto."""
    model_type: str
    layer_names: Mapping[str, str]
    """GGUF tensor part (blk.N.<part>.weight) -> Hugging Face module under model.layers.N."""
    configure: Callable[[Metadata, dict[str, Any]], None]
    """Sets the architecture's own config fields over the common ones."""
    permute_qk: bool = False
    """llama.cpp reorders Llama's q and k rows to rotate adjacent pairs; loom rotates halves."""
    norm_shift: float = 0.0
    """Taken off every norm weight: Gemma's converter adds 1 (its norms scale by 1 + w)."""
    config_tensors: frozenset[str] = field(default_factory=frozenset)
    """Tensors read into the config (rope factors), not loaded as weights."""

    def hf_name(self, name: str, path: str) -> str:
        """`name`'s Hugging Face name; stacked experts' holds `{expert}`."""
        parts = name.split(".")
        if parts[0] == "blk" and len(parts) in (4, 5) and parts[1].isdigit():
            part, kind = ".".join(parts[2:-1]), parts[-1]
            old = _OLD_EXPERT_RE.fullmatch(part)
            if old and self.architecture == "MixtralForCausalLM":
                module = f"mlp.experts.{old.group(2)}.{old.group(1)[4:]}_proj"
                return f"model.layers.{parts[1]}.{module}.{kind}"
            if part in self.layer_names and kind in ("weight", "bias"):
                return f"model.layers.{parts[1]}.{self.layer_names[part]}.{kind}"
        elif len(parts) == 2 and parts[0] in _GLOBAL and parts[1] in ("weight", "bias"):
            return f"{_GLOBAL[parts[0]]}.{parts[1]}"
        raise ValueError(f"{path}: tensor {name!r} has no {self.architecture} counterpart "
                         "in Hugging Face")


_GLOBAL = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


# -- what each architecture adds to the common config -------------------------------------
def _llama(m: Metadata, config: dict[str, Any]) -> None:
    config["attention_bias"] = m.has("blk.0.attn_q.bias")
    divisors = _config_tensor(m, "rope_freqs.weight")
    if divisors is not None:
        scaling = llama3_rope(divisors, config["head_dim"], config["rope_theta"])
        if scaling is None:
            logger.warning("%s: ignoring rope_freqs.weight: its factors are not Llama 3's "
                           "rope scaling (low_freq_factor 1, high_freq_factor 4, 8192 "
                           "pretraining positions)", m.path)
        else:
            config["rope_scaling"] = scaling


def _mixtral(m: Metadata, config: dict[str, Any]) -> None:
    _llama(m, config)
    config["num_local_experts"] = int(m.require("expert_count"))
    config["num_experts_per_tok"] = int(m.require("expert_used_count"))


def _nothing_more(m: Metadata, config: dict[str, Any]) -> None:
    """Qwen2 and Qwen3: the common fields say it all (Qwen3's head size as key_length)."""


def _qwen_moe(norm_topk_prob: bool) -> Callable[[Metadata, dict[str, Any]], None]:
    def configure(m: Metadata, config: dict[str, Any]) -> None:
        config["num_experts"] = int(m.require("expert_count"))
        config["num_experts_per_tok"] = int(m.require("expert_used_count"))
        # llama.cpp renormalises Qwen3-MoE's top-k weights and not Qwen2-MoE's.
        config["norm_topk_prob"] = bool(m.get("expert_weights_norm", norm_topk_prob))
        # Every layer routes, as llama.cpp's models assume; older files have no
        # expert_*_length keys, only the tensors' shapes.
        config["mlp_only_layers"] = []
        experts = m.shape("blk.0.ffn_gate_exps.weight")
        if experts is None:
            raise ValueError(f"{m.path}: a {m.arch} GGUF without blk.0.ffn_gate_exps.weight "
                             "(llama.cpp's stacked experts)")
        config["moe_intermediate_size"] = int(m.get("expert_feed_forward_length") or experts[1])
        shared = m.shape("blk.0.ffn_gate_shexp.weight")
        if shared is not None:
            config["shared_expert_intermediate_size"] = int(
                m.get("expert_shared_feed_forward_length") or shared[0])
    return configure


def _phi3(m: Metadata, config: dict[str, Any]) -> None:
    rope_dims = m.get("rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != config["head_dim"]:
        config["partial_rotary_factor"] = int(rope_dims) / config["head_dim"]
    window = m.get("attention.sliding_window")
    if window:  # 0: none (Phi-4)
        config["sliding_window"] = int(window)
    original = m.get("rope.scaling.original_context_length")
    if original is not None:
        config["original_max_position_embeddings"] = int(original)
    long, short = (_config_tensor(m, f"rope_factors_{k}.weight") for k in ("long", "short"))
    if (long is None) != (short is None):
        raise ValueError(f"{m.path}: a Phi-3 GGUF with only one of rope_factors_long and "
                         "rope_factors_short")
    if long is not None:
        config["rope_scaling"] = {"rope_type": "longrope", "long_factor": long.tolist(),
                                  "short_factor": short.tolist()}
        attention = m.get("rope.scaling.attn_factor")
        if attention is not None:
            config["rope_scaling"]["attention_factor"] = float(attention)


_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}
"""llama.cpp scales Gemma's queries by 1/sqrt(hidden / heads) in the 27B models (the layer
count tells them), by 1/sqrt(head_dim) in the others, as their configs' query_pre_attn_scalar
say; GGUF has no key for it."""


def _gemma(m: Metadata, config: dict[str, Any]) -> None:
    config["hidden_activation"] = "gelu_pytorch_tanh"
    big = config["num_hidden_layers"] == _GEMMA_27B_LAYERS[m.arch]
    config["query_pre_attn_scalar"] = (config["hidden_size"] // config["num_attention_heads"]
                                       if big else config["head_dim"])
    window = m.get("attention.sliding_window")
    if window:
        config["sliding_window"] = int(window)
        config["layer_types"] = _layer_types(m, config["num_hidden_layers"])
    final = m.get("final_logit_softcapping", 30.0 if m.arch == "gemma2" else None)
    config["final_logit_softcapping"] = None if final is None else float(final)
    if m.arch == "gemma2":
        config["attn_logit_softcapping"] = float(m.get("attn_logit_softcapping", 50.0))
    else:
        # Gemma 3's local layers rotate with their own base, never scaled.
        config["rope_local_base_freq"] = float(m.get("rope.freq_base_swa", 10000.0))


def _layer_types(m: Metadata, layers: int) -> list[str]:
    """Each layer's attention: a sliding_window_pattern key (a period, or a flag per layer)
    where the file has one, else llama.cpp's: Gemma 2 alternates, Gemma 3 is global every
    sixth layer."""
    pattern = m.get("attention.sliding_window_pattern", 2 if m.arch == "gemma2" else 6)
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ValueError(f"{m.path}: {m.arch}.attention.sliding_window_pattern has "
                             f"{len(pattern)} entries for {layers} layers")
        sliding = [bool(p) for p in pattern]
    else:
        sliding = [bool((i + 1) % int(pattern)) for i in range(layers)]
    return ["sliding_attention" if s else "full_attention" for s in sliding]


_ROPE_FREQS = frozenset({"rope_freqs.weight"})
ARCHS = {
    "llama": GGUFArch("LlamaForCausalLM", "llama", _LAYER, _llama, permute_qk=True,
                      config_tensors=_ROPE_FREQS),
    "qwen2": GGUFArch("Qwen2ForCausalLM", "qwen2", _LAYER, _nothing_more),
    "qwen3": GGUFArch("Qwen3ForCausalLM", "qwen3", {**_LAYER, **_QK_NORM}, _nothing_more),
    "qwen2moe": GGUFArch("Qwen2MoeForCausalLM", "qwen2_moe",
                         {**_LAYER, **_EXPERTS, **_SHARED_EXPERT}, _qwen_moe(False)),
    "qwen3moe": GGUFArch("Qwen3MoeForCausalLM", "qwen3_moe",
                         {**_LAYER, **_QK_NORM, **_EXPERTS}, _qwen_moe(True)),
    "phi3": GGUFArch("Phi3ForCausalLM", "phi3", {**_LAYER, **_PHI3}, _phi3,
                     config_tensors=frozenset({"rope_factors_long.weight",
                                               "rope_factors_short.weight"})),
    "gemma2": GGUFArch("Gemma2ForCausalLM", "gemma2", {**_LAYER, **_GEMMA_NORMS}, _gemma,
                       norm_shift=1.0),
    "gemma3": GGUFArch("Gemma3ForCausalLM", "gemma3_text",
                       {**_LAYER, **_GEMMA_NORMS, **_QK_NORM}, _gemma, norm_shift=1.0),
}
"""GGUF's general.architecture -> how loom reads it."""
MIXTRAL = GGUFArch("MixtralForCausalLM", "mixtral", {**_LAYER, **_EXPERTS}, _mixtral,
                   permute_qk=True, config_tensors=_ROPE_FREQS)
"""llama.cpp writes Mixtral as 'llama' with experts."""


def gguf_arch(reader: GGUFReader, path: str) -> tuple[str, GGUFArch]:
    """The file's general.architecture and how loom reads it."""
    found = reader.fields.get("general.architecture")
    name = None if found is None else found.contents()
    if name not in ARCHS:
        raise ValueError(f"{path}: GGUF architecture {name!r} is not supported "
                         f"({', '.join(ARCHS)}; load other models from their Hugging Face "
                         "safetensors checkpoint)")
    if name == "llama" and Metadata(reader, name, path).get("expert_count"):
        return name, MIXTRAL
    return name, ARCHS[name]


def dequantized(tensor: ReaderTensor) -> np.ndarray:
    """A GGUF tensor as float32, in torch's order of dimensions."""
    array = dequantize(tensor.data, tensor.tensor_type)
    # GGUF shapes list the innermost dimension first; torch wants it last.
    shape = tuple(int(d) for d in reversed(tensor.shape))
    array = np.asarray(array, dtype=np.float32).reshape(shape)
    # F32 tensors come back as views of the read-only memory map.
    return array if array.flags.writeable and array.flags.c_contiguous else array.copy()


def _config_tensor(m: Metadata, name: str) -> np.ndarray | None:
    tensor = m.tensors.get(name)
    return None if tensor is None else dequantized(tensor).reshape(-1)


def llama3_rope(divisors: np.ndarray, head_dim: int, theta: float) -> dict[str, Any] | None:
    """The Llama 3 rope_scaling whose frequency divisors llama.cpp wrote as rope_freqs, where
    they are those of Llama 3.x's own parameters (low_freq_factor 1, high_freq_factor 4, 8192
    positions) with the largest divisor as factor; None otherwise."""
    factor = float(divisors.max())
    scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    old, low, high = 8192, 1.0, 4.0
    smooth = (old / wavelen - low) / (high - low)
    expected = np.where(wavelen < old / high, 1.0, np.where(
        wavelen > old / low, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    if divisors.shape != expected.shape or not np.allclose(divisors, expected, rtol=1e-5):
        return None
    return scaling
