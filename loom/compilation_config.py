"""`compilation_config` (vLLM's CompilationConfig and PassConfig, as `-O` gives them): frozen
dataclasses validated on construction, like the rest of `loom.config`, and without torch."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from loom.config_checks import check as _check
from loom.config_checks import from_dict as _from_dict

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PassConfig:
    enable_noop: bool = True
    """Remove no-op reshapes and slices before the other passes match."""
    enable_sequence_parallelism: bool = False
    """Rewrite all_reduce -> RMSNorm into reduce_scatter -> RMSNorm -> all_gather."""
    enable_async_tp: bool = False
    """Fuse all_gather/reduce_scatter with the adjacent matmuls (implies sequence
    parallelism)."""
    enable_all_reduce_norm_fusion: bool = True
    """With TP > 1, all_reduce -> residual add -> RMSNorm as one op: one kernel per site for
    decode batches, over symmetric memory (CUDA)."""

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            _check(isinstance(value, bool), f"compilation_config.pass_config.{f.name}: must be "
                                            f"true or false, got {value!r}")
        if self.enable_async_tp and not self.enable_sequence_parallelism:
            object.__setattr__(self, "enable_sequence_parallelism", True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PassConfig:
        """A `pass_config` JSON object, vLLM's newer names included (`PASS_ALIASES`); its
        fp8-quantization fusions (`QUANT_FUSIONS`) are accepted and match nothing here."""
        where = "compilation_config.pass_config"
        data = dict(data)
        for alias, name in PASS_ALIASES.items():
            if alias in data:
                _check(name not in data or data[name] == data[alias],
                       f"{where}: {alias} and {name} differ; {alias} is vLLM's newer name for "
                       f"{name}, give one of them")
                data[name] = data.pop(alias)
        for name in QUANT_FUSIONS.intersection(data):
            value = data.pop(name)
            _check(isinstance(value, bool) or value is None,
                   f"{where}.{name}: must be true or false, got {value!r}")
            if value:
                logger.info("%s.%s: fuses fp8 quantization ops, which no loom model has; it "
                            "matches nothing", where, name)
        return _from_dict(cls, data, where)


PASS_ALIASES = {"enable_sp": "enable_sequence_parallelism", "fuse_gemm_comms": "enable_async_tp",
                "eliminate_noops": "enable_noop",
                "fuse_allreduce_rms": "enable_all_reduce_norm_fusion"}
"""vLLM's newer pass_config names (its PassConfig since 0.12) for loom's (vLLM's earlier)."""
QUANT_FUSIONS = frozenset({"enable_fusion", "enable_attn_fusion", "fuse_norm_quant",
                           "fuse_act_quant", "fuse_attn_quant"})
"""vLLM's pass_config flags that fuse fp8 quantization into its neighbours (RMSNorm, SiLU·mul,
attention)."""


CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
COMPILATION_MODES = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2,
                     "VLLM_COMPILE": 3}
"""vLLM's CompilationMode names, which `mode` takes beside its numbers (any case)."""


VLLM_ONLY_FIELDS = frozenset({
    "custom_ops", "use_inductor_graph_partition", "cudagraph_num_of_warmups",
    "cudagraph_copy_inputs", "cudagraph_specialize_lora", "debug_dump_path", "cache_dir",
    "compile_cache_save_format", "compile_mm_encoder", "inductor_passes",
    "compile_ranges_split_points", "dynamic_shapes_config"})
"""vLLM CompilationConfig fields with no counterpart here: refused by name, not as unknown."""
CAPTURE_SIZES = "cudagraph_capture_sizes"
"""vLLM's `compile_sizes` entry for every decode capture size."""


def default_capture_sizes(max_num_seqs: int) -> list[int]:
    """vLLM's default decode capture sizes: 1, 2, 4, then multiples of 8 up to 512, none past
    max_num_seqs."""
    sizes = [1, 2, 4] + list(range(8, 513, 8))
    return [s for s in sizes if s <= max_num_seqs] or [1]


@dataclass(frozen=True)
class CompilationConfig:
    level: int | None = None
    """0 eager; 1-2 plain torch.compile; 3 piecewise Inductor compile + CUDA graphs.
    None: `mode`'s value; with neither given, the device picks it (`resolved`): 3 on CUDA,
    as vLLM's default there, and 0 on the CPU."""
    mode: int | None = None
    """vLLM's newer name for `level` (its CompilationMode: 0-3, or its names NONE,
    STOCK_TORCH_COMPILE, DYNAMO_TRACE_ONCE, VLLM_COMPILE in any case); after construction
    both hold the same number. Giving both, with different values, is an error."""
    compile_sizes: tuple[int | str, ...] = ()
    """Token counts compiled for their static shape, besides the dynamic graph. vLLM's entry
    "cudagraph_capture_sizes" stands for every decode capture size (`capture_sizes`):
    replaced by them here where cudagraph_capture_sizes is given, else once max_num_seqs is
    known (`resolved`)."""
    splitting_ops: tuple[str, ...] | None = None
    """Ops the graph is split at; None means attention; () keeps one whole graph."""
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    """Batch sizes captured as CUDA graphs; None picks 1, 2, 4, 8 and multiples of 8.
    Under PIECEWISE, the token counts the pieces are captured at instead."""
    max_cudagraph_capture_size: int | None = None
    """The largest decode batch the default capture sizes go up to (as vLLM's; the default
    list also stops at max_num_seqs). Given with cudagraph_capture_sizes, it must be their
    largest."""
    cudagraph_mode: str = "FULL_AND_PIECEWISE"
    """FULL_DECODE_ONLY: pure-decode batches replay whole-forward CUDA graphs (the sizes
    above). FULL_AND_PIECEWISE (the default, as vLLM's): besides, at level 3 with the graph
    split at attention, the pieces are captured on their second run at a size and replayed
    after, attention running eagerly between them, so a prefill's or mixed batch's host time
    goes: at each compile_sizes entry (its static graph), and for batches no decode graph
    takes of up to max_num_batched_tokens, padded to 8, 16, 32 ... (the general graph).
    PIECEWISE: the pieces only, decode batches too; given cudagraph_capture_sizes, batches
    are padded to those. FULL: as FULL_AND_PIECEWISE, and besides, prefills and mixed
    batches of up to the largest decode capture size replay whole-forward CUDA graphs too,
    padded to the same sizes (`worker/cuda_graph.py`). NONE: no CUDA graphs."""
    pass_config: PassConfig = field(default_factory=PassConfig)
    """Custom Inductor passes."""
    inductor_compile_config: dict[str, Any] = field(default_factory=dict)
    """Inductor config options for levels 1-3, e.g. {"max_autotune": true}; names are
    torch._inductor.config's and are checked when compiling."""

    def __post_init__(self) -> None:
        self._merge_mode()
        for name in ("compile_sizes", "cudagraph_capture_sizes", "splitting_ops"):
            value = getattr(self, name)
            if isinstance(value, list):
                object.__setattr__(self, name, tuple(value))
        for name in ("compile_sizes", "cudagraph_capture_sizes"):
            value = getattr(self, name)
            entry = f' or "{CAPTURE_SIZES}"' if name == "compile_sizes" else ""
            _check((value is None and name == "cudagraph_capture_sizes")
                   or (isinstance(value, tuple) and all(
                       (type(v) is int and v > 0) or (entry and v == CAPTURE_SIZES)
                       for v in value)),
                   f"compilation_config.{name}: must be a list of positive integers{entry}, "
                   f"got {value!r}")
        cap = self.max_cudagraph_capture_size
        _check(cap is None or (type(cap) is int and cap > 0),
               f"compilation_config.max_cudagraph_capture_size: must be a positive integer, got "
               f"{cap!r}")
        _check(cap is None or not self.cudagraph_capture_sizes
               or cap == max(self.cudagraph_capture_sizes),
               f"compilation_config.max_cudagraph_capture_size: {cap} is not the largest of "
               f"cudagraph_capture_sizes {list(self.cudagraph_capture_sizes or ())}")
        _check(self.splitting_ops is None or (isinstance(self.splitting_ops, tuple) and all(
            isinstance(op, str) and op for op in self.splitting_ops)),
            "compilation_config.splitting_ops: must be a list of op names (e.g. "
            f"[\"loom::attention\"]) or [], got {self.splitting_ops!r}")
        if self.cudagraph_capture_sizes is not None:
            object.__setattr__(self, "compile_sizes",
                               self._expanded_sizes(self.cudagraph_capture_sizes))
        mode = self.cudagraph_mode
        if isinstance(mode, str) and mode.upper() in CUDAGRAPH_MODES:  # any case, as vLLM's
            object.__setattr__(self, "cudagraph_mode", mode.upper())
        _check(self.cudagraph_mode in CUDAGRAPH_MODES,
               f"compilation_config.cudagraph_mode: must be one of {list(CUDAGRAPH_MODES)}, got "
               f"{self.cudagraph_mode!r}")
        _check(isinstance(self.inductor_compile_config, dict),
               "compilation_config.inductor_compile_config: expected a JSON object, got "
               f"{type(self.inductor_compile_config).__name__}")
        if isinstance(self.pass_config, dict):
            object.__setattr__(self, "pass_config", PassConfig.from_dict(self.pass_config))
        _check(isinstance(self.pass_config, PassConfig),
               "compilation_config.pass_config: expected a JSON object, got "
               f"{type(self.pass_config).__name__}")
        _check(self.level in (None, 3) or not self.pass_config.enable_sequence_parallelism,
               "compilation_config.pass_config: sequence parallelism and async TP are level-3 "
               f"passes; set \"level\": 3 (got level {self.level})")

    def _merge_mode(self) -> None:
        if isinstance(self.mode, str):
            mode = COMPILATION_MODES.get(self.mode.upper())
            _check(mode is not None, f"compilation_config.mode: {self.mode!r} is not one of "
                                     f"0-3 or {list(COMPILATION_MODES)}")
            object.__setattr__(self, "mode", mode)
        for name in ("level", "mode"):
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                value = int(value)  # vLLM's CompilationMode is an IntEnum
                object.__setattr__(self, name, value)
            _check(value is None or (type(value) is int and value in (0, 1, 2, 3)),
                   f"compilation_config.{name}: must be 0-3, got {value!r}")
        _check(self.level is None or self.mode is None or self.level == self.mode,
               f"compilation_config: level {self.level} and mode {self.mode} differ; mode is "
               "vLLM's newer name for level, give one of them")
        level = self.mode if self.level is None else self.level
        object.__setattr__(self, "level", level)
        object.__setattr__(self, "mode", level)

    @property
    def decode_graphs(self) -> bool:
        """Whether pure-decode batches replay whole-forward CUDA graphs."""
        return self.cudagraph_mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")

    @property
    def piece_graphs(self) -> bool:
        """Whether the compiled pieces between attention calls replay CUDA graphs."""
        return self.cudagraph_mode in ("PIECEWISE", "FULL", "FULL_AND_PIECEWISE")

    def _expanded_sizes(self, capture_sizes) -> tuple[int | str, ...]:
        """compile_sizes with "cudagraph_capture_sizes" replaced by capture_sizes."""
        if CAPTURE_SIZES not in self.compile_sizes:
            return self.compile_sizes
        return tuple(sorted({s for s in self.compile_sizes if s != CAPTURE_SIZES}
                            .union(capture_sizes)))

    def capture_sizes(self, max_num_seqs: int) -> list[int]:
        """The decode batch sizes to capture: cudagraph_capture_sizes, else vLLM's default
        list up to max_num_seqs and max_cudagraph_capture_size."""
        if self.cudagraph_capture_sizes is not None:
            return list(self.cudagraph_capture_sizes)
        return default_capture_sizes(min(max_num_seqs,
                                         self.max_cudagraph_capture_size or max_num_seqs))

    def resolved(self, device_type: str, max_num_seqs: int | None = None) -> CompilationConfig:
        """This config with what was left open filled in: an unset level for the device (3
        on CUDA, vLLM's default there, or when the level-3 passes are asked for, else 0; a
        set level stays), and given max_num_seqs, compile_sizes' "cudagraph_capture_sizes"
        as the capture sizes."""
        config = self
        if self.level is None:
            on = device_type == "cuda" or self.pass_config.enable_sequence_parallelism
            config = dataclasses.replace(self, level=3 if on else 0, mode=None)
        if max_num_seqs is not None and CAPTURE_SIZES in config.compile_sizes:
            config = dataclasses.replace(config, compile_sizes=config._expanded_sizes(
                config.capture_sizes(max_num_seqs)))
        return config

    @classmethod
    def parse(cls, value: CompilationConfig | dict | str | int | None) -> CompilationConfig:
        """Accept an object, a dict, a JSON string (`-O '{...}'`) or a bare level (`-O3`)."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, int):
            return cls(level=value)
        if isinstance(value, str):
            value = compilation_dict(value)
        if not isinstance(value, dict):
            raise ValueError(f"compilation_config: expected a JSON object, got {type(value).__name__}")
        value = dict(value)
        backend = value.pop("backend", "")
        _check(backend in ("", "inductor"), "compilation_config.backend: loom compiles with "
                                            f"Inductor only (\"inductor\"), got {backend!r}")
        elsewhere = sorted(VLLM_ONLY_FIELDS.intersection(value))
        _check(not elsewhere, f"compilation_config: {elsewhere}: vLLM option(s) that loom does "
                              "not implement")
        return _from_dict(cls, value, "compilation_config")


def compilation_dict(text: str) -> dict[str, Any]:
    """`-O`'s text as a dict: a JSON object, or a bare level (`3` -> {"level": 3})."""
    text = text.strip()
    if re.fullmatch(r"-?[0-9]+", text):  # a bare level; -1 gets the level's own message
        return {"level": int(text)}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"compilation_config: not valid JSON ({e.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"compilation_config: expected a JSON object, got {type(value).__name__}")
    return value
