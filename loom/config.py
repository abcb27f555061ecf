"""Engine configuration: frozen dataclasses, composed into one `EngineConfig`.

Each field is documented where it is declared. Validation raises `ValueError` naming the
field; derived values are properties. Nothing here imports torch, so the API server can
build and validate a config without it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

DTYPES = ("auto", "bfloat16", "float16", "float32")
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DEVICES = ("auto", "cuda", "cpu")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
"""auto: the model's dtype. fp8 (= fp8_e4m3) and fp8_e5m2 store keys and values in 8 bits,
unscaled (vLLM's k_scale = v_scale = 1.0), saturated at the format's largest finite value."""


DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "fp32": "float32"}
"""vLLM's other spellings (a torch.dtype is accepted too: `torch.float16` names one)."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


@dataclass(frozen=True)
class ModelConfig:
    model: str
    """Path to a Hugging Face model directory, a `.gguf` file, a `config.json`, or the name
    of a shipped benchmark config (e.g. `llama-3.1-8b`)."""
    tokenizer: str | None = None
    """Tokenizer directory or file; defaults to the model's own."""
    dtype: str = "auto"
    """Weight and activation dtype: auto (the checkpoint's, float32 on CPU), bfloat16,
    float16 or float32."""
    max_model_len: int | None = None
    """Longest prompt + output, in tokens; defaults to the model's context length."""
    load_format: str = "auto"
    """auto (by file type), safetensors, gguf, or dummy (random weights from the config)."""
    seed: int = 0
    """Seed for dummy weights and for requests that give no seed of their own."""

    def __post_init__(self) -> None:
        _check(isinstance(self.model, str) and bool(self.model),
               "model: must name a model path or a shipped config")
        name = str(self.dtype).removeprefix("torch.")
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(name, name))
        _check(self.dtype in DTYPES, f"dtype: {self.dtype!r} is not one of {DTYPES} "
                                     f"(or {sorted(DTYPE_ALIASES)})")
        _check(self.load_format in LOAD_FORMATS,
               f"load_format: {self.load_format!r} is not one of {LOAD_FORMATS}")
        _check(self.max_model_len is None or self.max_model_len > 0,
               f"max_model_len: must be positive, got {self.max_model_len}")


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    """Tokens per KV-cache block."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory loom may use in all (weights, activations, KV cache)."""
    kv_cache_memory_bytes: int | None = None
    """Explicit KV-cache budget in bytes; overrides gpu_memory_utilization. On CPU the
    default is 1 GiB."""
    enable_prefix_caching: bool = True
    """Reuse the KV blocks of identical prompt prefixes across requests."""
    cache_dtype: str = "auto"
    """The KV cache's element type, one of KV_CACHE_DTYPES (vLLM's --kv-cache-dtype). fp8
    halves the cache's bytes: twice the tokens in the same memory, and half the reads of a
    decode's attention; the model computes in its own dtype either way."""

    def __post_init__(self) -> None:
        _check(self.cache_dtype in KV_CACHE_DTYPES,
               f"kv_cache_dtype: {self.cache_dtype!r} is not one of {KV_CACHE_DTYPES}")
        _check(self.block_size > 0 and self.block_size & (self.block_size - 1) == 0,
               f"block_size: must be a positive power of two, got {self.block_size}")
        _check(0.0 < self.gpu_memory_utilization <= 1.0,
               f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        _check(self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes > 0,
               f"kv_cache_memory_bytes: must be positive, got {self.kv_cache_memory_bytes}")


USAGE_CONTEXTS = ("llm", "api_server")

LARGE_GPU_BYTES = 70 * 2**30
"""GPUs with at least this much memory (other than A100s) get vLLM's larger batch defaults."""


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int | None = None
    """Most requests running in one step. None: by device, as vLLM chooses: 1024 on GPUs
    with at least 70 GiB (A100s excepted), else 256; at most max_num_batched_tokens when
    that is given (a step holds no more requests than tokens)."""
    max_num_batched_tokens: int | None = None
    """Most tokens (prefill chunks + decodes) in one step; longer prompts are chunked.
    None: by device and usage, as vLLM chooses: on GPUs with at least 70 GiB (A100s
    excepted) 16384 offline (`LLM`, benchmarks) and 8192 for the API server; on other GPUs
    8192 and 2048; on the CPU 8192."""
    async_scheduling: bool = True
    """Schedule and launch step N+1 while the device still runs step N: a decode's input
    token is the one step N samples, written on the device. Requests whose next step
    depends on host-side token values (guided decoding, penalties, seeds, pending
    min_tokens) wait for their result instead."""
    usage_context: str = "llm"
    """Who drives the engine, "llm" (offline, benchmarks) or "api_server": picks the
    defaults above."""
    kv_headroom_tokens: int = 512
    """KV blocks kept for decoding at admission: a waiting request is admitted only while
    the free blocks can still hold, for it and for every running request, the tokens each
    may yet generate (its max_tokens less what it has), counting at most this many each.
    Without it (0, vLLM's policy) a full batch admitted while prompts fit runs out of blocks
    as it decodes and preempts requests, which are then recomputed from the start."""

    def __post_init__(self) -> None:
        _check(self.max_num_seqs is None or self.max_num_seqs > 0,
               f"max_num_seqs: must be positive, got {self.max_num_seqs}")
        _check(self.max_num_batched_tokens is None or self.max_num_batched_tokens > 0,
               f"max_num_batched_tokens: must be positive, got {self.max_num_batched_tokens}")
        _check(self.max_num_seqs is None or self.max_num_batched_tokens is None
               or self.max_num_batched_tokens >= self.max_num_seqs,
               f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least "
               f"max_num_seqs ({self.max_num_seqs}): a full batch of decodes takes a token each")
        _check(self.kv_headroom_tokens >= 0,
               f"kv_headroom_tokens: must not be negative, got {self.kv_headroom_tokens}")
        _check(self.usage_context in USAGE_CONTEXTS,
               f"usage_context: {self.usage_context!r} is not one of {USAGE_CONTEXTS}")

    def resolved(self, device_name: str | None, device_memory: int) -> SchedulerConfig:
        """The defaults filled in for a device (name None: the CPU). Every rank and the
        engine core must agree, so the worker resolves once and reports what it chose."""
        server = self.usage_context == "api_server"
        if device_name is None:
            tokens, seqs = 8192, 256
        elif device_memory >= LARGE_GPU_BYTES and "a100" not in device_name.lower():
            tokens, seqs = (8192 if server else 16384), 1024
        else:
            tokens, seqs = (2048 if server else 8192), 256
        tokens = self.max_num_batched_tokens or tokens
        return dataclasses.replace(self, max_num_seqs=self.max_num_seqs or min(seqs, tokens),
                                   max_num_batched_tokens=tokens)


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    """Number of devices (or CPU processes) a model is sharded over."""

    def __post_init__(self) -> None:
        _check(self.tensor_parallel_size > 0,
               f"tensor_parallel_size: must be positive, got {self.tensor_parallel_size}")


@dataclass(frozen=True)
class DeviceConfig:
    device: str = "auto"
    """auto (cuda when available), cuda or cpu."""

    def __post_init__(self) -> None:
        _check(self.device in DEVICES, f"device: {self.device!r} is not one of {DEVICES}")


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
    compile_sizes: tuple[int, ...] = ()
    """Token counts compiled for their static shape, besides the dynamic graph."""
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
    are padded to those. FULL: runs as FULL_AND_PIECEWISE, since loom's attention cannot
    take a mixed batch into one graph (vLLM downgrades such backends alike). NONE: no CUDA
    graphs."""
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
            _check((value is None and name == "cudagraph_capture_sizes")
                   or (isinstance(value, tuple)
                       and all(type(v) is int and v > 0 for v in value)),
                   f"compilation_config.{name}: must be a list of positive integers, got "
                   f"{value!r}")
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

    def resolved(self, device_type: str) -> CompilationConfig:
        """This config with an unset level filled in for the device: 3 on CUDA (vLLM's
        default there) or when the level-3 passes are asked for, else 0. A set level stays."""
        if self.level is not None:
            return self
        on = device_type == "cuda" or self.pass_config.enable_sequence_parallelism
        return dataclasses.replace(self, level=3 if on else 0, mode=None)

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


def _from_dict(cls, data: dict[str, Any], where: str):
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    _check(not unknown, f"{where}: unknown field(s) {unknown}; known: {sorted(names)}")
    return cls(**data)


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    compilation: CompilationConfig = field(default_factory=CompilationConfig)
    enforce_eager: bool = False
    """Run the model eagerly: no torch.compile, no CUDA graphs."""
