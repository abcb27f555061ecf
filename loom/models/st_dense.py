"""A sentence-transformers model's Dense modules (modules.json entries after its Pooling,
EmbeddingGemma's 768 -> 3072 -> 768): linear maps applied to the pooled vector before it
is normalised, as `SentenceTransformer.encode` applies them."""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from loom.tasks import st_modules

_ACTIVATIONS = {"torch.nn.modules.linear.Identity": None,
                "torch.nn.modules.activation.Tanh": torch.tanh}

Dense = tuple[torch.Tensor, torch.Tensor | None, object]
"""(weight [out, in], bias or None, activation or None), in float32."""


def dense_modules(model_dir: str, device: torch.device) -> list[Dense]:
    """The Dense modules modules.json lists, in order ([] for other directories)."""
    return [_load(os.path.join(model_dir, m.get("path", "")), device)
            for m in st_modules(model_dir, ".Dense")]


def _load(path: str, device: torch.device) -> Dense:
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    name = config.get("activation_function", "torch.nn.modules.linear.Identity")
    if name not in _ACTIVATIONS:
        raise ValueError(f"{path}/config.json: activation_function {name!r} is not one loom "
                         f"applies ({', '.join(_ACTIVATIONS)})")
    weights_file = os.path.join(path, "model.safetensors")
    if not os.path.isfile(weights_file):
        raise ValueError(f"{path}: a Dense module without model.safetensors (loom reads no "
                         "pickled weights)")
    tensors = load_file(weights_file, device=str(device))
    weight = tensors["linear.weight"].float()
    if tuple(weight.shape) != (config["out_features"], config["in_features"]):
        raise ValueError(f"{path}: linear.weight has shape {tuple(weight.shape)}; its config "
                         f"says [{config['out_features']}, {config['in_features']}]")
    bias = tensors.get("linear.bias") if config.get("bias", True) else None
    return weight, None if bias is None else bias.float(), _ACTIVATIONS[name]


def project(vector: torch.Tensor, modules: list[Dense]) -> torch.Tensor:
    for weight, bias, activation in modules:
        vector = F.linear(vector.float(), weight, bias)
        if activation is not None:
            vector = activation(vector)
    return vector
