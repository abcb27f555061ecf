"""Tiny fp8 (and int8 W8A8) checkpoints written by compressed-tensors (the library
llm-compressor saves with) from the random test models, and transformers' reading of them:
the reference loom's 8-bit layers are held to. Scales come from compressed-tensors' own
`calculate_qparams`."""

from __future__ import annotations

import re
from pathlib import Path

import torch

CALIBRATION = [[1, 5, 9, 33, 7, 100, 200, 3], [4, 44, 144, 240, 17]]


def _args(strategy: str, dynamic: bool, block: list[int] | None = None, kind: str = "float"):
    from compressed_tensors.quantization import QuantizationArgs
    return QuantizationArgs(num_bits=8, type=kind, strategy=strategy, symmetric=True,
                            dynamic=dynamic, block_structure=block)


SCHEMES = {  # name -> (weight strategy, activation strategy, dynamic activations)
    "fp8-dynamic": ("channel", "token", True),    # llm-compressor's FP8_DYNAMIC
    "fp8-static": ("tensor", "tensor", False),    # llm-compressor's FP8
    "fp8-tensor-dynamic": ("channel", "tensor", True),
    "fp8-block": ("block", "group", True),        # llm-compressor's FP8_BLOCK
    "int8-dynamic": ("channel", "token", True),   # llm-compressor's W8A8 (int8)
    "int8-static": ("tensor", "tensor", False),
    "int8-tensor-dynamic": ("channel", "tensor", True),
}


def _kind(scheme: str) -> str:
    """compressed-tensors' type of a scheme's weights and activations."""
    return "int" if scheme.startswith("int8") else "float"


def _group(targets: list[str], scheme: str, group_size: int | None = None,
           block: list[int] | None = None):
    """block: (rows, cols) of "fp8-block"'s weight blocks (FP8_BLOCK's are 128 x 128), whose
    activations are scaled per group of `cols` features."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    weights, acts, dynamic = SCHEMES[scheme]
    if block is not None:
        group_size = block[1]
    if group_size is not None:
        acts = "group"
    return QuantizationScheme(
        targets=targets, weights=_args(weights, False, block, _kind(scheme)),
        input_activations=QuantizationArgs(num_bits=8, type=_kind(scheme), strategy=acts,
                                           symmetric=True, dynamic=dynamic,
                                           group_size=group_size))


def fp8_quantize(model, groups: dict, ignore: list[str]) -> None:
    """Apply compressed-tensors' quantization `groups` to `model` (in place: its forward
    fake-quantizes from then on), with weight and static input scales from its
    `calculate_qparams`."""
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationStatus,
                                                 apply_quantization_config)
    from compressed_tensors.quantization.utils import calculate_qparams
    static = any(not g.input_activations.dynamic for g in groups.values())
    input_amax = _input_amax(model) if static else {}
    apply_quantization_config(model, QuantizationConfig(
        config_groups=groups, ignore=ignore, quantization_status=QuantizationStatus.INITIALIZED))
    for name, module in model.named_modules():
        if not hasattr(module, "weight_scale"):
            continue
        args, w = module.quantization_scheme.weights, module.weight.data
        lo, hi = _weight_range(w, args)
        module.weight_scale.data.copy_(calculate_qparams(lo, hi, args)[0]
                                       .reshape(module.weight_scale.shape))
        if name in input_amax and hasattr(module, "input_scale"):
            amax = input_amax[name].reshape(1)
            scale, _ = calculate_qparams(-amax, amax, module.quantization_scheme.input_activations)
            module.input_scale.data.copy_(scale.reshape(module.input_scale.shape))


def _weight_range(w: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight's min and max per scale: per row, per block (zero padding to whole
    blocks, as compressed-tensors pads them) or over the tensor."""
    if args.strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    if args.strategy == "block":
        rows, cols = args.block_structure
        pad = (-w.shape[1] % cols, -w.shape[0] % rows)
        blocks = torch.nn.functional.pad(w, (0, pad[0], 0, pad[1]))
        blocks = blocks.view(blocks.shape[0] // rows, rows, blocks.shape[1] // cols, cols)
        return blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3))
    return w.amin().reshape(1), w.amax().reshape(1)


def write_fp8_checkpoint(model, path: str, scheme: str, ignore: list[str],
                         block: list[int] | None = None) -> None:
    """Quantize `model` (a transformers model, changed in place) as `scheme` and save it
    compressed to `path`, as llm-compressor saves one."""
    from compressed_tensors.compressors import ModelCompressor
    fp8_quantize(model, {"group_0": _group(["Linear"], scheme, block=block)}, ignore)
    compressor = ModelCompressor.from_pretrained_model(
        model, quantization_format=f"{_kind(scheme)}-quantized")
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(path)


def checkpoint_cache(tmp_path_factory, cases: dict):
    """A module fixture's body: case id -> (checkpoint path, transformers' reading of it,
    unquantized path and model), each written once. cases: id -> (model kind, scheme,
    ignored modules). loom computes dynamic per-tensor scales per token (batch-invariant),
    so a "tensor-dynamic" scheme's reference reads them per token."""
    from tests.conftest import make_tiny_model
    cache = {}

    def get(case: str):
        if case not in cache:
            kind, scheme, ignore = cases[case]
            base = str(tmp_path_factory.mktemp(f"{kind}-base"))
            path = str(tmp_path_factory.mktemp(case))
            write_fp8_checkpoint(make_tiny_model(kind, base), path, scheme, ignore)
            ref = (as_per_token(path, str(tmp_path_factory.mktemp(f"{case}-ref")))
                   if scheme.endswith("tensor-dynamic") else path)
            cache[case] = (path, load_reference(ref), base, make_tiny_model(kind, base))
        return cache[case]
    return get


def tp_reference(model, tp: int, ignore: list[str], scheme: str = "fp8-dynamic"):
    """`model` quantized as `scheme` (fp8- or int8-dynamic) runs at tensor-parallel size
    tp: a row-parallel layer's ranks each scale their own slice of a token's features,
    which is dynamic per-group activation quantization with groups of in_features / tp."""
    cfg = model.config
    attn_in = cfg.num_attention_heads * cfg.head_dim
    fp8_quantize(model, {
        "columns": _group(["re:.*(q|k|v|gate|up)_proj$"], scheme),
        "o_proj": _group(["re:.*o_proj$"], scheme, attn_in // tp),
        "down_proj": _group(["re:.*down_proj$"], scheme, cfg.intermediate_size // tp),
    }, ignore)
    return model.eval()


def load_reference(path: str):
    """transformers' reading of an fp8 checkpoint (compressed-tensors decompresses it and
    fake-quantizes activations)."""
    import transformers as tf
    return tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _input_amax(model) -> dict[str, torch.Tensor]:
    """Static activation scales' calibration: each Linear's largest input over a few
    prompts (the stacked q/k/v and gate/up see one input, so their scales agree, as
    llm-compressor's do)."""
    amax, hooks = {}, []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            def hook(mod, args, name=name):
                seen = args[0].detach().abs().amax()
                amax[name] = torch.maximum(amax.get(name, seen), seen)
            hooks.append(module.register_forward_pre_hook(hook))
    with torch.no_grad():
        for prompt in CALIBRATION:
            model(torch.tensor([prompt]))
    for h in hooks:
        h.remove()
    return amax


def as_per_token(path: str, dest: str) -> str:
    """A copy of the checkpoint at `path` whose dynamic activation scales are per token
    (the weights unchanged): how loom runs a dynamic per-tensor checkpoint."""
    import json
    import shutil
    shutil.copytree(path, dest, dirs_exist_ok=True)
    config = json.loads((Path(dest) / "config.json").read_text())
    for group in config["quantization_config"]["config_groups"].values():
        group["input_activations"]["strategy"] = "token"
    (Path(dest) / "config.json").write_text(json.dumps(config))
    return dest


def as_fp8_method(path: str, dest: str) -> str:
    """The compressed-tensors block-wise checkpoint at `path` as the `fp8` method writes one
    (Qwen3-8B-FP8's layout): the same fp8 weights, each block scale as float32
    `weight_scale_inv`, and a config naming `weight_block_size`. transformers' own reader
    of that format (FineGrainedFP8) dequantizes to bf16 without a GPU, so the reference
    stays compressed-tensors' reading of `path`."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file
    shutil.copytree(path, dest, dirs_exist_ok=True)
    config = json.loads((Path(dest) / "config.json").read_text())
    group = config["quantization_config"]["config_groups"]["group_0"]
    config["quantization_config"] = {
        "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
        "weight_block_size": group["weights"]["block_structure"]}
    (Path(dest) / "config.json").write_text(json.dumps(config))
    tensors = {(name + "_inv" if name.endswith(".weight_scale") else name):
               (t.float() if name.endswith(".weight_scale") else t)
               for name, t in load_file(Path(dest) / "model.safetensors").items()}
    save_file(tensors, Path(dest) / "model.safetensors", metadata={"format": "pt"})
    return dest


_LINEAR = re.compile(r"\.(q|k|v|o|gate|up|down)_proj\.weight$")


def write_block_fp8(base: str, dest: str, block: list[int]) -> str:
    """The unquantized checkpoint at `base` as a block-wise `fp8` one, quantized by loom's
    own `quantize_blocks` (no compressed-tensors): for checks of loom against itself (the
    GPU against the CPU) and of what it refuses."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    from loom.quantization.fp8_block import quantize_blocks
    shutil.copytree(base, dest, dirs_exist_ok=True)
    tensors = load_file(Path(dest) / "model.safetensors")
    for name in [n for n in tensors if _LINEAR.search(n) and ".experts." not in n]:
        tensors[name], tensors[name + "_scale_inv"] = quantize_blocks(tensors[name], block)
    save_file(tensors, Path(dest) / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((Path(dest) / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "fmt": "e4m3", "weight_block_size": block}
    (Path(dest) / "config.json").write_text(json.dumps(config))
    return dest
