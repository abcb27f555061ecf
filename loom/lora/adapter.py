"""Reading and checking a PEFT LoRA adapter without torch (the API process does it).

An adapter directory holds adapter_config.json and adapter_model.safetensors with one
`lora_A` ([r, in]) and one `lora_B` ([out, r]) tensor per adapted projection, named after
the base model's module (`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`).
Everything that loom could not apply is refused here, naming it, before a request reaches
the engine.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass

from loom.lora.request import LoRARequest
from loom.models.names import NEVER_DOWNLOADED, hub_shaped, missing

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
               "qkv_proj", "gate_up_proj")
"""The base model's linear layers an adapter may target (attention and dense MLPs; the
fused two where the base model has them, as Phi-3 does)."""


@dataclass(frozen=True)
class AdapterSpec:
    """A checked adapter: what the worker loads into a slot."""
    path: str
    rank: int
    scaling: float
    """lora_alpha / r (lora_alpha / sqrt(r) with use_rslora): B A's weight in the output."""
    modules: dict[str, tuple[str, str]]
    """Base module name (`model.layers.0.self_attn.q_proj`) -> its A and B tensor names."""


def model_targets(arch) -> dict[str, list[int]]:
    """Every module name an adapter may target in a model (its `ModelArch`) -> the
    [out, in] of its full (unsharded) weight: attention, and the MLPs of dense layers
    (not experts, routed or shared), named as the base model names them (Phi-3's fused
    qkv_proj and gate_up_proj)."""
    if arch.interleaved_rope:
        raise ValueError(f"lora_request: LoRA adapters on {arch.architecture} are not supported "
                         "(its q/k rows are reordered as they load, which an adapter's would "
                         "need too)")
    q, kv, h = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim, arch.hidden_size
    i = arch.intermediate_size
    if arch.fused_checkpoint:
        attn = {"qkv_proj": [q + 2 * kv, h], "o_proj": [h, q]}
        mlp = {"gate_up_proj": [2 * i, h], "down_proj": [h, i]}
    else:
        attn = {"q_proj": [q, h], "k_proj": [kv, h], "v_proj": [kv, h], "o_proj": [h, q]}
        mlp = {"gate_proj": [i, h], "up_proj": [i, h], "down_proj": [h, i]}
        if not arch.gated_mlp:  # a lone up_proj takes no adapter here
            mlp = {"down_proj": [h, i]}
    out = {}
    for i in range(arch.num_layers):
        out.update({f"model.layers.{i}.self_attn.{p}": s for p, s in attn.items()})
        if not arch.is_moe_layer(i):
            out.update({f"model.layers.{i}.mlp.{p}": s for p, s in mlp.items()})
    return out


def read_adapter(request: LoRARequest, targets: dict[str, list[int]],
                 max_rank: int) -> AdapterSpec:
    """Check the adapter at request.lora_path against the model (targets: model_targets)
    and max_lora_rank; a ValueError names what is wrong."""
    where = f"lora_request {request.lora_name!r} ({request.lora_path})"
    config = _read_config(request.lora_path, where)
    rank = config.get("r")
    if type(rank) is not int or rank < 1:
        raise ValueError(f"{where}: adapter_config.json's r must be a positive integer, "
                         f"got {rank!r}")
    if rank > max_rank:
        raise ValueError(f"{where}: rank {rank} is above max_lora_rank ({max_rank}); raise "
                         "it (--max-lora-rank, LLM(max_lora_rank=...))")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"{where}: adapter_config.json's lora_alpha must be a number")
    _refuse_unsupported(config, where)
    scaling = alpha / (math.sqrt(rank) if config.get("use_rslora") else rank)
    modules = _read_tensors(request.lora_path, where, targets, rank)
    return AdapterSpec(request.lora_path, rank, scaling, modules)


def _read_config(path: str, where: str) -> dict:
    file = os.path.join(path, CONFIG_FILE)
    if not os.path.exists(path) and hub_shaped(path):
        raise ValueError(f"{where}: no such directory, and {missing(path, None, None)}; "
                         f"{NEVER_DOWNLOADED}")
    if not os.path.isfile(file):
        raise ValueError(f"{where}: no {CONFIG_FILE} there (a PEFT LoRA adapter directory "
                         "is needed)")
    try:
        with open(file) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: {CONFIG_FILE} cannot be read: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: {CONFIG_FILE} must hold a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{where}: peft_type {config['peft_type']!r} is not LORA")
    return config


def _refuse_unsupported(config: dict, where: str) -> None:
    refused = {"use_dora": "DoRA adapters", "modules_to_save": "modules_to_save (fully "
               "trained layers)", "rank_pattern": "per-module ranks (rank_pattern)",
               "alpha_pattern": "per-module alphas (alpha_pattern)",
               "fan_in_fan_out": "fan_in_fan_out weights", "layer_replication":
               "layer_replication", "trainable_token_indices": "trainable_token_indices"}
    for key, what in refused.items():
        if config.get(key):
            raise ValueError(f"{where}: {what} are not supported ({key} is set)")
    if config.get("bias", "none") != "none":
        raise ValueError(f"{where}: adapters with biases (bias={config['bias']!r}) are not "
                         "supported")


def _read_tensors(path: str, where: str, targets: dict[str, list[int]],
                  rank: int) -> dict[str, tuple[str, str]]:
    header = _safetensors_header(path, where)
    found: dict[str, dict[str, tuple[str, list[int]]]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        module, _, kind = name.removeprefix(PREFIX).rpartition(".lora_")
        kind = kind.split(".")[0]
        if module not in targets or kind not in ("A", "B") or not name.endswith(".weight"):
            raise ValueError(f"{where}: tensor {name!r} targets what loom cannot adapt "
                             f"(only {', '.join(_projections(targets))} of decoder layers, "
                             "the MLP ones where the layer's MLP is dense)")
        found.setdefault(module, {})[kind] = (name, info["shape"])
    if not found:
        raise ValueError(f"{where}: {WEIGHTS_FILE} holds no LoRA tensors")
    modules = {}
    for module, pair in found.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(f"{where}: {module} has lora_{''.join(pair)} but not both A and B")
        out, in_ = targets[module]
        (a_name, a_shape), (b_name, b_shape) = pair["A"], pair["B"]
        if list(a_shape) != [rank, in_] or list(b_shape) != [out, rank]:
            raise ValueError(f"{where}: {module}'s A is {a_shape} and B {b_shape}; the "
                             f"model and rank {rank} make them {[rank, in_]} and {[out, rank]}")
        modules[module] = (a_name, b_name)
    return modules


def _projections(targets: dict[str, list[int]]) -> list[str]:
    names = {module.rpartition(".")[2] for module in targets}
    return [p for p in PROJECTIONS if p in names]


def _safetensors_header(path: str, where: str) -> dict:
    file = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(file):
        other = " (adapter_model.bin is not read: save it as safetensors)" \
            if os.path.isfile(os.path.join(path, "adapter_model.bin")) else ""
        raise ValueError(f"{where}: no {WEIGHTS_FILE} there{other}")
    try:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        end = max((t["data_offsets"][1] for n, t in header.items() if n != "__metadata__"),
                  default=0)
    except (OSError, ValueError, struct.error, KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{where}: {WEIGHTS_FILE} is not a safetensors file: {e}") from None
    if os.path.getsize(file) < 8 + size + end:  # the header read; the tensors are not
        raise ValueError(f"{where}: {WEIGHTS_FILE} is truncated: {os.path.getsize(file)} "
                         f"bytes, its header needs {8 + size + end}")
    return header
