"""Tiny int4 weight-only (W4A16) checkpoints written by compressed-tensors from the random
test models, the AutoAWQ and GPTQ layouts of the same weights, and transformers' reading
of the compressed-tensors one: the reference loom's int4 layers are held to. Scales and
zero points come from compressed-tensors' own `calculate_qparams`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

GROUP = 32
"""The tiny models' layers are 32-128 features wide: groups of 32 give each layer several."""


def _args(group: int | None, symmetric: bool, bits: int = 4):
    from compressed_tensors.quantization import QuantizationArgs
    return QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric,
                            strategy="channel" if group is None else "group", group_size=group)


def write_int4_checkpoint(model, path: str, group: int | None, symmetric: bool,
                          ignore: list[str], bits: int = 4):
    """Quantize `model` (a transformers model) to int4 weights, a scale per `group` input
    features (None: per channel) and zero points unless symmetric, and save it compressed
    (pack-quantized) to `path`, as llm-compressor's W4A16 recipes do. Returns the
    reference: the model as compressed-tensors runs it before compression (its forward
    fake-quantizes the weights with the same scales and zero points). transformers' own
    reading of the saved checkpoint is no reference here: with compressed-tensors 0.20.1 it
    expects unpacked zero points and refuses asymmetric checkpoints."""
    import copy
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationScheme,
                                                 QuantizationStatus, apply_quantization_config)
    from compressed_tensors.quantization.utils import calculate_qparams
    args = _args(group, symmetric, bits)
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
        ignore=ignore, quantization_status=QuantizationStatus.INITIALIZED))
    for module in model.modules():
        if not hasattr(module, "weight_scale"):
            continue
        w = module.weight.data
        w = w.reshape(w.shape[0], -1, group or w.shape[1])
        scale, zero = calculate_qparams(w.amin(-1), w.amax(-1), args)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))
    reference = copy.deepcopy(model).eval()
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(path)
    return reference


_PACKED = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape")


def _rewrite(path: str, dest: str, quantization_config: dict, convert) -> str:
    """A copy of the checkpoint at `path` with each quantized layer's int4 tensors (a dict
    of compressed-tensors' names without the module prefix) replaced by
    `convert(tensors, module name)`; biases and the rest stay."""
    from safetensors.torch import load_file, save_file
    shutil.copytree(path, dest, dirs_exist_ok=True)
    tensors = load_file(Path(dest) / "model.safetensors")
    modules = sorted({n.rsplit(".", 1)[0] for n in tensors if n.endswith(".weight_packed")})
    for module in modules:
        own = {k: tensors.pop(f"{module}.{k}") for k in _PACKED if f"{module}.{k}" in tensors}
        tensors.update({f"{module}.{k}": v for k, v in convert(own, module).items()})
    save_file(tensors, Path(dest) / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((Path(dest) / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (Path(dest) / "config.json").write_text(json.dumps(config))
    return dest


def _values(t: dict, bits: int = 4) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A layer's unsigned int4 weights [out, in] and zero points [out, groups] (or None),
    unpacked by compressed-tensors."""
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32
    shape = torch.Size(t["weight_shape"].tolist())
    mid = 1 << (bits - 1)
    q = unpack_from_int32(t["weight_packed"], bits, shape).to(torch.int32) + mid
    if "weight_zero_point" not in t:
        return q, None
    zshape = torch.Size([shape[0], t["weight_scale"].shape[1]])
    zero = unpack_from_int32(t["weight_zero_point"], bits, zshape, packed_dim=0)
    return q, zero.to(torch.int32) + mid


def _pack(unsigned: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """Eight unsigned int4 values per int32 along dim 1, value i at bits 4i
    (compressed-tensors' packing)."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    return pack_to_int32((unsigned - (1 << (bits - 1))).to(torch.int8), bits)


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
"""AutoAWQ's GEMM packing: nibble i of a word holds column AWQ_ORDER[i] of its eight."""


def _awq_pack(unsigned: torch.Tensor) -> torch.Tensor:
    rows, cols = unsigned.shape
    return _pack(unsigned.view(rows, cols // 8, 8)[..., AWQ_ORDER].reshape(rows, cols))


def _to_awq(t: dict, module: str | None = None) -> dict:
    q, zero = _values(t)
    return {"qweight": _awq_pack(q.t().contiguous()), "qzeros": _awq_pack(zero.t().contiguous()),
            "scales": t["weight_scale"].t().contiguous()}


def as_awq(path: str, dest: str, group: int, not_converted: list[str]) -> str:
    """The asymmetric compressed-tensors checkpoint at `path` in AutoAWQ's GEMM layout (the
    same integers, scales and zero points): qweight [in, out / 8] and qzeros packed along
    the output features in AWQ's nibble order, scales [in / group, out]. not_converted:
    AutoAWQ's modules_to_not_convert (name fragments) for the layers `path` left dense."""
    return _rewrite(path, dest, {"quant_method": "awq", "bits": 4, "group_size": group,
                                 "zero_point": True, "version": "gemm",
                                 "modules_to_not_convert": not_converted}, _to_awq)


def _to_gptq(t: dict, g_idx: torch.Tensor | None = None, bits: int = 4) -> dict:
    q, zero = _values(t, bits)
    assert zero is None, "GPTQ checkpoints here are symmetric"
    out, k = q.shape
    groups = t["weight_scale"].shape[1]
    mid = 1 << (bits - 1)  # zero points of mid stored as mid - 1 (7, or 127 for 8 bits)
    return {"qweight": _pack(q, bits).t().contiguous(),
            "qzeros": _pack(torch.full((groups, out), mid - 1, dtype=torch.int32), bits),
            "scales": t["weight_scale"].t().contiguous(),
            "g_idx": (torch.arange(k) // (k // groups) if g_idx is None else g_idx)
            .to(torch.int32)}


def as_gptq(path: str, dest: str, group: int | None, g_idx=None, bits: int = 4,
            **config) -> str:
    """The symmetric compressed-tensors checkpoint at `path` in GPTQ's layout: qweight
    [in / 8, out] (the same words, transposed), scales [in / group, out], qzeros all 7,
    g_idx each input feature's group (or `g_idx(in_features)`)."""
    qc = {"quant_method": "gptq", "bits": bits, "group_size": group or -1, "desc_act": False,
          "sym": True, "checkpoint_format": "gptq", **config}
    return _rewrite(path, dest, qc, lambda t, module: _to_gptq(
        t, None if g_idx is None else g_idx(t["weight_shape"][1].item()), bits))


_INPUTS = {"q_proj": "attn", "k_proj": "attn", "v_proj": "attn", "o_proj": "o",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "down"}
"""Projections that share an input share its act order (GPTQ's Hessian is the input's)."""


def write_act_order_gptq(model, path: str, group: int, seed: int = 3):
    """An act-order (desc_act) GPTQ checkpoint of `model` at `path`, and its reference.

    Each decoder layer's inputs get a random order of their features (as GPTQ takes them by
    activation size); the model with every projection's columns in that order is quantized
    by compressed-tensors (symmetric, contiguous groups of `group`), and the integers and
    scales are written back in the features' own order, with g_idx naming each feature's
    group. The reference is the unquantized model with each weight replaced by
    compressed-tensors' dequantization of those integers, its columns put back in order."""
    import copy
    import tempfile

    from safetensors.torch import load_file
    gen = torch.Generator().manual_seed(seed)
    permuted, perms = copy.deepcopy(model), {}
    for name, module in permuted.named_modules():
        kind = name.rsplit(".", 1)[-1]
        if kind in _INPUTS:
            key = (name.rsplit(".", 2)[0], _INPUTS[kind])
            k = module.weight.shape[1]
            perms.setdefault(key, torch.randperm(k, generator=gen))
            perms[name] = perms[key]
            module.weight.data = module.weight.data[:, perms[name]]
    ct = tempfile.mkdtemp()
    write_int4_checkpoint(permuted, ct, group, True, ["lm_head"])
    tensors = load_file(Path(ct) / "model.safetensors")
    reference = copy.deepcopy(model).eval()
    for name, module in reference.named_modules():
        if name in perms:
            t = {k: tensors[f"{name}.{k}"] for k in _PACKED if f"{name}.{k}" in tensors}
            q, _ = _values(t)
            w = ((q - 8).float().view(q.shape[0], -1, group)
                 * t["weight_scale"].float().unsqueeze(-1))
            module.weight.data = w.reshape(q.shape)[:, torch.argsort(perms[name])]

    def convert(t: dict, module: str) -> dict:
        q, _ = _values(t)
        inverse = torch.argsort(perms[module])  # original column c is permuted column inverse[c]
        return {**_to_gptq(t), "qweight": _pack(q[:, inverse]).t().contiguous(),
                "g_idx": (inverse // group).to(torch.int32)}
    qc = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": True,
          "sym": True, "checkpoint_format": "gptq"}
    _rewrite(ct, path, qc, convert)
    return reference


def write_int4_moe_checkpoint(model, path: str, group: int, symmetric: bool, bits: int = 4):
    """An int4 checkpoint of a transformers MoE model (Qwen3-MoE's fused experts): its
    Linear layers by `write_int4_checkpoint`, and every expert's gate, up and down
    projection quantized alike by compressed-tensors' `quantize` (scales and zero points
    from `calculate_qparams`), written as the original checkpoint names them
    (`experts.{e}.gate_proj.weight_packed`, ...). Returns the reference: the model as
    compressed-tensors runs its Linear layers, its experts replaced by compressed-tensors'
    `fake_quantize` of them."""
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize, quantize
    from compressed_tensors.quantization.utils import calculate_qparams
    from safetensors.torch import load_file, save_file
    args = _args(group, symmetric, bits)
    quantized = {}  # checkpoint name -> tensor
    fake = {}  # (layer, "gate_up_proj" | "down_proj") -> the dequantized stacked weight
    for name, module in model.named_modules():
        if not hasattr(module, "gate_up_proj"):
            continue
        prefix = name.replace(".experts", "") + ".experts"
        inter = module.gate_up_proj.shape[1] // 2
        stacks = {"gate_up_proj": [], "down_proj": []}
        for e in range(module.gate_up_proj.shape[0]):
            gate_up = module.gate_up_proj.data[e]
            parts = {"gate_proj": gate_up[:inter], "up_proj": gate_up[inter:],
                     "down_proj": module.down_proj.data[e]}
            deq = {}
            for proj, w in parts.items():
                g = w.reshape(w.shape[0], -1, group)
                scale, zero = calculate_qparams(g.amin(-1), g.amax(-1), args)
                q = quantize(w, scale, zero, args, dtype=torch.int8)
                deq[proj] = fake_quantize(w, scale, zero, args)
                base = f"{prefix}.{e}.{proj}"
                quantized[f"{base}.weight_packed"] = _pack(q.to(torch.int32) + (1 << (bits - 1)),
                                                           bits)
                quantized[f"{base}.weight_scale"] = scale
                quantized[f"{base}.weight_shape"] = torch.tensor(w.shape)
                if not symmetric:  # packed along the rows, as compressed-tensors packs them
                    quantized[f"{base}.weight_zero_point"] = pack_to_int32(
                        zero.to(torch.int8), bits, packed_dim=0)
            stacks["gate_up_proj"].append(torch.cat([deq["gate_proj"], deq["up_proj"]]))
            stacks["down_proj"].append(deq["down_proj"])
        fake.update({(name, k): torch.stack(v) for k, v in stacks.items()})
    reference = write_int4_checkpoint(model, path, group, symmetric, ["lm_head"], bits)
    for (name, attr), w in fake.items():
        getattr(reference.get_submodule(name), attr).data.copy_(w)
    file = Path(path) / "model.safetensors"
    tensors = {n: t for n, t in load_file(file).items() if ".experts." not in n}
    save_file({**tensors, **quantized}, file, metadata={"format": "pt"})
    return reference
