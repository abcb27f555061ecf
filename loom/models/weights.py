"""Checkpoint names -> loom parameters, for every model in the registry.

Checkpoints keep q/k/v and gate/up (and MoE experts) as separate tensors; loom stacks
them into one parameter each. A rule maps a checkpoint name fragment to the stacked
parameter and the shard id its weight_loader expects.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable

import torch
from torch import nn

from loom.quantization.dequant import Fp8Dequantizer, Fp8Tensor

_STACKED = [  # (checkpoint fragment, loom fragment, shard id)
    (".q_proj.", ".qkv_proj.", "q"),
    (".k_proj.", ".qkv_proj.", "k"),
    (".v_proj.", ".qkv_proj.", "v"),
    (".gate_proj.", ".gate_up_proj.", 0),
    (".up_proj.", ".gate_up_proj.", 1),
]
_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\.(\w+)$")
_EXPERT_SHARDS = {"gate_proj": 0, "w1": 0, "up_proj": 1, "w3": 1, "down_proj": None, "w2": None}
"""An expert's projection (Qwen's names, Mixtral's) -> its shard of the stacked weights:
0 gate, 1 up (w13), None down (w2)."""
_RENAMED = [(".block_sparse_moe.", ".mlp.")]  # Mixtral's expert block is loom's mlp
_SCALE_INV = ".weight_scale_inv"
"""Block-wise `fp8` checkpoints' weight scale (Qwen3's, DeepSeek's FP8 releases): despite
its name it multiplies the fp8 values, as loom's weight_scale does."""
_IGNORED = ("rotary_emb.inv_freq",)
INT4_EXPERT_SUFFIXES = {"qweight": "", "weight_packed": "", "scales": "_scale",
                         "weight_scale": "_scale", "qzeros": "_zero", "weight_zero_point": "_zero",
                         "g_idx": "_g_idx", "weight_shape": "_shape", "weight": "",
                         "input_scale": "_input_scale"}
"""An int4 expert tensor's checkpoint suffix -> its FusedMoE parameter after w13 / w2."""


def _target(name: str, int4_experts: bool = False) -> tuple[str, object]:
    """(loom parameter name, shard id or None) for one checkpoint tensor. int4_experts: the
    model's experts are int4, whose packed weights, scales and zero points each have a
    parameter (`loom.quantization.int4_moe`)."""
    for ckpt, ours in _RENAMED:
        name = name.replace(ckpt, ours)
    if name.endswith(_SCALE_INV):
        name = name[:-len("_inv")]
    m = _EXPERT.search(name)
    suffixes = INT4_EXPERT_SUFFIXES if int4_experts else {"weight": ""}
    if m and m.group(3) in suffixes:
        expert, shard = int(m.group(1)), _EXPERT_SHARDS[m.group(2)]
        param = ("w2" if shard is None else "w13") + suffixes[m.group(3)]
        return f"{name[:m.start()]}.experts.{param}", (expert, shard)
    for ckpt, ours, shard in _STACKED:
        if ckpt in name:
            return name.replace(ckpt, ours), shard
    return name, None


def checkpoint_modules(module: str) -> list[str]:
    """The checkpoint's names for a loom module (qkv_proj -> q_proj, k_proj, v_proj)."""
    names = [(module + ".").replace(ours, ckpt)[:-1] for ckpt, ours, _ in _STACKED
             if ours in module + "."]
    return names or [module]


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_partial = False
"""Set by `partial()`: the tensors loaded may be some of the model's (a weight update)."""


@contextlib.contextmanager
def partial():
    """load_weights within the block fills the parameters it is given and leaves the rest
    as they are (an RL trainer's update), instead of refusing an incomplete checkpoint."""
    global _partial
    previous, _partial = _partial, True
    try:
        yield
    finally:
        _partial = previous


def load_named_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Load every tensor; return the names of the parameters that were filled. Raises
    ValueError for a tensor with no parameter, or a parameter left unfilled."""
    params = dict(model.named_parameters(remove_duplicate=False))
    tied = getattr(model, "arch", None) is not None and model.arch.tie_word_embeddings
    pairs = Fp8Dequantizer(getattr(model, "fp8_weight_block", None))
    int4_experts = getattr(model, "int4_experts", False)
    loaded: set[str] = set()
    for name, tensor in weights:
        if name.endswith(_IGNORED) or (tied and name == "lm_head.weight"):
            continue
        ready = _paired(name, tensor, params, pairs, type(model).__name__, int4_experts)
        if ready is None:
            continue  # an fp8 weight or scale waiting for the other
        target, shard, tensor = ready
        param = params[target]
        if isinstance(tensor, Fp8Tensor) and not getattr(param, "takes_fp8", False):
            tensor = pairs.dequantize(tensor)
        if not isinstance(tensor, Fp8Tensor) and not getattr(param, "raw_checkpoint", False):
            tensor = tensor.to(param.dtype)
        loader = getattr(param, "weight_loader", default_weight_loader)
        loader(param, tensor, shard)
        loaded.add(target)
    pairs.check_done()
    if not _partial:
        _check_complete(params, loaded, tied)
    return loaded


def _paired(name: str, tensor: torch.Tensor, params: dict, pairs: Fp8Dequantizer, owner: str,
            int4_experts: bool = False):
    """(parameter name, shard id, what it loads) for one checkpoint tensor, or None while
    an fp8 weight outside the fp8 linear layers waits for its scale (or a scale for its
    weight). What it loads is the tensor, or an fp8 weight paired with its scale."""
    target, shard = _target(name, int4_experts)
    if target not in params and shard is not None and name in params:
        target, shard = name, None  # a projection of its own here (Arcee's lone up_proj)
    if target not in params and pairs.is_scale(name):
        # the scale of an fp8 weight outside the fp8 linear layers (an MoE expert's)
        tensor = pairs.add_scale(name, tensor)
        if tensor is None:
            return None
        name = tensor.name
        target, shard = _target(name)
    if target not in params:
        raise ValueError(f"checkpoint tensor {name!r} matches no parameter of {owner}")
    param = params[target]
    if isinstance(tensor, torch.Tensor) and tensor.dtype in _FP8 and param.dtype != tensor.dtype:
        if param.dtype in _FP8:
            raise ValueError(f"checkpoint tensor {name!r} is {tensor.dtype}, and loom's "
                             f"fp8 layers hold {param.dtype}")
        tensor = pairs.weight(name, tensor)
        if tensor is None:
            return None
    return target, shard, tensor


def _check_complete(params: dict, loaded: set[str], tied: bool) -> None:
    missing = sorted(n for n in params
                     if n not in loaded and not (tied and n == "lm_head.weight"))
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"checkpoint is missing {len(missing)} weight(s): {shown}")


def default_weight_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"weight shape {tuple(loaded.shape)} does not match the parameter's "
                         f"{tuple(param.shape)}")
    param.data.copy_(loaded)
