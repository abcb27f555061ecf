"""Which 8-bit scheme a model's linear layers run, from `--quantization` and the checkpoint's
`quantization_config`. Torch-free: the engine checks it before any worker starts.

loom computes W8A8 fp8: weights in float8_e4m3fn with a scale per output channel (a
checkpoint's per-tensor scales are spread over their rows), activations quantized as they
arrive, per token unless the checkpoint gives a static scale. A checkpoint's dynamic
per-tensor activation scale is computed per token too: more exact, at no cost in a
row-scaled GEMM, and a request's output then never depends on what it is batched with.
Two checkpoint formats are read: compressed-tensors' float-quantized FP8 (llm-compressor's
FP8_DYNAMIC, FP8 and FP8_BLOCK schemes) and the `fp8` method (per-tensor scales, or
block-wise ones as Qwen3's and DeepSeek's FP8 releases have them). Block-wise checkpoints
scale each weight block (128 x 128 in every release so far; the size comes from the
config) and activations per token per group of a block's input features, computed as they
arrive. int8 W8A8 (compressed-tensors' int-quantized format, llm-compressor's W8A8 scheme)
runs as fp8 does with int8 in its place: weights per channel, activations per token or by
a static per-tensor scale, all symmetric. Anything else a checkpoint asks for is refused by
name rather than run differently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from loom.quantization.int4_config import (ALIASES, EXPERTS_INT8, INT4_METHODS, Int4Scheme,
                                           awq_scheme, experts_int8_scheme, gptq_scheme,
                                           pack_quantized_scheme)

QUANTIZATIONS = ("fp8", "compressed-tensors", "awq", "gptq", "awq_marlin", "gptq_marlin",
                 EXPERTS_INT8)
"""`--quantization` values: fp8 quantizes a model's weights at load (or reads an fp8
checkpoint), experts_int8 its MoE experts (to int8); the others name what the checkpoint's
own config says (int4 weights for awq and gptq, `loom.quantization.int4_config`; vLLM's
*_marlin names are the same here)."""

DTYPES = ("fp8", "int8")
"""An 8-bit scheme's weights and activations: float8_e4m3fn, or int8 (compressed-tensors'
int-quantized W8A8, llm-compressor's W8A8 scheme) scaled per channel, activations per token
or by a static scale."""

ACTIVATIONS = ("token", "static", "group")
"""token: a scale computed per token as the activations arrive; static: the checkpoint's
`input_scale`; group: a scale per token per group of input features as wide as a weight
block (block-wise checkpoints only)."""


@dataclass(frozen=True)
class Fp8Scheme:
    method: str
    """fp8 or compressed-tensors: what the logs and errors call it."""
    weights_in_checkpoint: bool
    """The checkpoint holds fp8 weights with their scales; False: weights are quantized
    at load, one scale per output channel."""
    activations: str
    """One of ACTIVATIONS."""
    ignore: tuple[str, ...] = ()
    """Checkpoint module names (or "re:" patterns) that stay in the model's dtype."""
    weight_block: tuple[int, int] | None = None
    """(output rows, input columns) of a block sharing one weight scale, for block-wise
    checkpoints (activations "group", in groups of the columns); None: a scale per output
    channel."""
    dtype: str = "fp8"
    """One of DTYPES: what the weights and the quantized activations are."""

    def __post_init__(self) -> None:
        if self.activations not in ACTIVATIONS:
            raise ValueError(f"activations: {self.activations!r} is not one of {ACTIVATIONS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {DTYPES}")
        if self.dtype == "int8" and (self.weight_block is not None
                                     or not self.weights_in_checkpoint):
            raise ValueError("dtype: int8 weights come from a checkpoint, scaled per channel")
        if (self.activations == "group") != (self.weight_block is not None):
            raise ValueError("weight_block: block-wise weights go with activations 'group', "
                             f"and only they (got {self.weight_block!r}, {self.activations!r})")

    def ignores(self, checkpoint_name: str) -> bool:
        return any(re.match(p[3:], checkpoint_name) if p.startswith("re:")
                   else p == checkpoint_name for p in self.ignore)

    def describe(self) -> str:
        source = "from the checkpoint" if self.weights_in_checkpoint else "quantized at load"
        if self.weight_block is not None:
            rows, cols = self.weight_block
            return (f"fp8 weights ({source}) scaled per {rows}x{cols} block, activations "
                    f"dynamic per token per {cols} features")
        acts = {"token": "dynamic per token",
                "static": "static (the checkpoint's input scales)"}[self.activations]
        return f"{self.dtype} weights ({source}), activations {acts}"


def quant_scheme(hf_config: dict[str, Any],
                 requested: str | None) -> Fp8Scheme | Int4Scheme | None:
    """The scheme for `--quantization requested` and the checkpoint's config; None for an
    unquantized model. ValueError naming the field for anything loom does not run."""
    if requested is not None and requested not in QUANTIZATIONS:
        raise ValueError(f"quantization: {requested!r} is not supported; loom runs "
                         f"{', '.join(QUANTIZATIONS)}")
    requested = ALIASES.get(requested, requested)
    qc = hf_config.get("quantization_config")
    if qc is None:
        if requested == EXPERTS_INT8:
            return experts_int8_scheme()
        if requested not in (None, "fp8"):
            raise ValueError(f"quantization: {requested!r} names a checkpoint format, "
                             "and the model's config.json has no quantization_config")
        return None if requested is None else Fp8Scheme("fp8", False, "token")
    if not isinstance(qc, dict):
        raise ValueError("quantization_config: must be a JSON object")
    method = qc.get("quant_method")
    if requested == EXPERTS_INT8:
        raise ValueError("quantization: 'experts_int8' quantizes an unquantized checkpoint's "
                         "MoE experts at load; this checkpoint is already quantized "
                         f"(quant_method {method!r})")
    if requested is not None and requested != method:
        raise ValueError(f"quantization: {requested!r} differs from the checkpoint's "
                         f"quantization_config.quant_method ({method!r})")
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method == "fp8":
        return _fp8_checkpoint(qc)
    if method in INT4_METHODS:
        return awq_scheme(qc) if method == "awq" else gptq_scheme(qc)
    raise ValueError(f"quantization_config.quant_method: {method!r} checkpoints are not "
                     "supported; loom reads fp8, compressed-tensors, awq and gptq "
                     "checkpoints")


def _fp8_checkpoint(qc: dict[str, Any]) -> Fp8Scheme:
    if qc.get("fmt", "e4m3") != "e4m3":
        raise ValueError(f"quantization_config.fmt: {qc['fmt']!r}; loom's fp8 layers hold "
                         "e4m3 (float8_e4m3fn) weights")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme not in ("dynamic", "static"):
        raise ValueError(f"quantization_config.activation_scheme: {scheme!r} is neither "
                         "'dynamic' nor 'static'")
    ignore = tuple(qc.get("ignored_layers") or qc.get("modules_to_not_convert") or ())
    if qc.get("weight_block_size") is None:
        return Fp8Scheme("fp8", True, "token" if scheme == "dynamic" else "static", ignore)
    block = _block("quantization_config.weight_block_size", qc["weight_block_size"])
    if scheme != "dynamic":
        # Static per-tensor input scales beside block-wise weights: no release has them.
        raise ValueError("quantization_config.activation_scheme: block-wise fp8 "
                         "(weight_block_size) runs dynamic activations only, got 'static'")
    return Fp8Scheme("fp8", True, "group", ignore, block)


def _block(where: str, value: Any) -> tuple[int, int]:
    if not (isinstance(value, list | tuple) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ValueError(f"{where}: {value!r} is not two positive integers "
                         "([output rows, input columns] of a weight block)")
    return value[0], value[1]


def _compressed_tensors(qc: dict[str, Any]) -> Fp8Scheme | Int4Scheme:
    for key in ("kv_cache_scheme", "transform_config"):
        if qc.get(key):
            raise ValueError(f"quantization_config.{key}: not supported (loom's fp8 KV cache "
                             "is --kv-cache-dtype fp8, unscaled)")
    sparsity = qc.get("sparsity_config") or {}
    if sparsity.get("format", "dense") != "dense":
        raise ValueError("quantization_config.sparsity_config: sparse checkpoints are not "
                         "supported")
    groups = qc.get("config_groups") or {}
    if not groups:
        raise ValueError("quantization_config.config_groups: none given")
    packed = [(g.get("format") or qc.get("format")) == "pack-quantized" for g in groups.values()]
    if any(packed):
        return _pack_quantized(qc, groups, all(packed))
    schemes = {_group_scheme(name, g, qc.get("format")) for name, g in groups.items()}
    if len(schemes) > 1:
        raise ValueError("quantization_config.config_groups: groups with different types, "
                         "activation schemes or weight blocks are not supported")
    dtype, activations, block = schemes.pop()
    return Fp8Scheme("compressed-tensors", True, activations, tuple(qc.get("ignore") or ()),
                     block, dtype)


def _pack_quantized(qc: dict[str, Any], groups: dict[str, Any], every: bool) -> Int4Scheme:
    """int4 weight-only groups (W4A16, W4A16_ASYM), all alike."""
    if not every:
        raise ValueError("quantization_config.config_groups: pack-quantized (int) groups "
                         "beside other formats are not supported")
    schemes = set()
    for name, group in groups.items():
        where = f"quantization_config.config_groups.{name}"
        _targets_linear(where, group)
        for key in ("input_activations", "output_activations"):
            if group.get(key):
                raise ValueError(f"{where}.{key}: int4 weights run with unquantized "
                                 "activations (W4A16); quantized activations are not supported")
        schemes.add(pack_quantized_scheme(f"{where}.weights", group.get("weights")))
    if len(schemes) > 1:
        raise ValueError("quantization_config.config_groups: groups with different group "
                         "sizes, zero points or bits are not supported")
    group_size, zero_point, bits = schemes.pop()
    return Int4Scheme("compressed-tensors", group_size, zero_point,
                      tuple(qc.get("ignore") or ()), bits=bits)


def _targets_linear(where: str, group: dict[str, Any]) -> None:
    if group.get("targets") != ["Linear"]:
        raise ValueError(f"{where}.targets: {group.get('targets')!r}; loom reads groups that "
                         "target every Linear (with `ignore` for the exceptions)")


_FORMATS = {"float": ("float-quantized", "naive-quantized"),
            "int": ("int-quantized", "naive-quantized")}
"""compressed-tensors' formats of unpacked 8-bit weights, by the weights' type."""


def _group_scheme(name: str, group: dict[str, Any],
                  top_format: str | None) -> tuple[str, str, tuple[int, int] | None]:
    """(dtype, activations, weight block) of one config group."""
    where = f"quantization_config.config_groups.{name}"
    fmt = group.get("format") or top_format
    weights = group.get("weights")
    kind = weights.get("type") if isinstance(weights, dict) else None
    if fmt not in _FORMATS.get(kind, _FORMATS["float"]):
        raise ValueError(f"{where}.format: {fmt!r} is not supported; loom reads fp8 "
                         "(float-quantized), int8 W8A8 (int-quantized) and int4/int8 "
                         "weight-only (pack-quantized) checkpoints")
    _targets_linear(where, group)
    if group.get("output_activations"):
        raise ValueError(f"{where}.output_activations: not supported")
    kind = "int" if kind == "int" else "float"
    _check_8bit(f"{where}.weights", weights, kind,
                ("channel", "tensor", "block") if kind == "float" else ("channel", "tensor"),
                dynamic=False)
    acts = group.get("input_activations")
    if acts is None:
        raise ValueError(f"{where}.input_activations: 8-bit weights without quantized "
                         "activations (W8A16) run from pack-quantized checkpoints only; "
                         f"loom runs {kind} weights with {kind} activations")
    _check_8bit(f"{where}.input_activations", acts, kind,
                ("token", "tensor", "group") if kind == "float" else ("token", "tensor"),
                dynamic=None)
    dtype = "fp8" if kind == "float" else "int8"
    if weights["strategy"] == "block":
        return dtype, "group", _block_activations(where, weights, acts)
    if acts["strategy"] == "group":
        raise ValueError(f"{where}.input_activations.strategy: 'group' scales go with "
                         "block-wise weights (strategy 'block') only")
    if not acts.get("dynamic"):
        if acts["strategy"] != "tensor":
            raise ValueError(f"{where}.input_activations: static scales must be per tensor")
        return dtype, "static", None
    return dtype, "token", None


def _block_activations(where: str, weights: dict, acts: dict) -> tuple[int, int]:
    """The weight block of FP8_BLOCK's scheme, whose activations must be dynamic per group
    of one block's columns: the matmul scales each block's partial sum by one activation
    scale and one weight scale."""
    block = _block(f"{where}.weights.block_structure", weights.get("block_structure"))
    if acts["strategy"] != "group" or not acts.get("dynamic") \
            or acts.get("group_size") != block[1]:
        raise ValueError(f"{where}.input_activations: block-wise weights ({block[0]}x"
                         f"{block[1]}) run with dynamic activation scales per group of "
                         f"{block[1]} features (strategy 'group', group_size {block[1]}, as "
                         f"FP8_BLOCK writes them), got strategy {acts['strategy']!r}, group_size "
                         f"{acts.get('group_size')!r}, dynamic {bool(acts.get('dynamic'))}")
    return block


def _check_8bit(where: str, args: Any, kind: str, strategies: tuple[str, ...],
                dynamic: bool | None) -> None:
    """kind: float (fp8) or int (int8)."""
    if not isinstance(args, dict):
        raise ValueError(f"{where}: missing")
    wanted = {"num_bits": 8, "type": kind, "symmetric": True}
    name = "fp8 (8-bit float" if kind == "float" else "int8 (8-bit integers"
    for key, value in wanted.items():
        if args.get(key, value) != value:
            raise ValueError(f"{where}.{key}: {args.get(key)!r}; loom runs {name}, "
                             "symmetric) here")
    strategy = args.get("strategy")
    if strategy not in strategies:
        raise ValueError(f"{where}.strategy: {strategy!r} is not one of "
                         f"{', '.join(strategies)}")
    own = {"group": "group_size", "block": "block_structure"}.get(strategy)
    for key in ("group_size", "block_structure"):
        if key != own and args.get(key) is not None:
            raise ValueError(f"{where}.{key}: given with strategy {strategy!r}, which has none")
    if dynamic is not None and bool(args.get("dynamic")) != dynamic:
        raise ValueError(f"{where}.dynamic: must be {str(dynamic).lower()}")
