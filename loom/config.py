"""Engine configuration: frozen dataclasses, composed into one `EngineConfig`.

Each field is documented where it is declared. Validation raises `ValueError` naming the
field; derived values are properties. Nothing here imports torch, so the API server can
build and validate a config without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from loom.compilation_config import CompilationConfig, PassConfig, compilation_dict
from loom.config_checks import check as _check
from loom.config_checks import json_object, name_list
from loom.lora_config import LoRAConfig
from loom.pooler_config import check_pooler_config
from loom.quantization.config import QUANTIZATIONS
from loom.speculative_config import SpeculativeConfig

__all__ = ["DTYPES", "LOAD_FORMATS", "DEVICES", "KV_CACHE_DTYPES", "DTYPE_ALIASES",
           "TOKENIZER_MODES", "EXECUTOR_BACKENDS", "USAGE_CONTEXTS", "SCHEDULING_POLICIES",
           "LARGE_GPU_BYTES", "ModelConfig",
           "CacheConfig", "SchedulerConfig", "ParallelConfig", "DeviceConfig", "LoRAConfig",
           "EngineConfig",
           # the compilation config lives in loom.compilation_config; vLLM users find it here
           "CompilationConfig", "PassConfig", "compilation_dict"]

DTYPES = ("auto", "bfloat16", "float16", "float32")
LOAD_FORMATS = ("auto", "safetensors", "gguf", "dummy")
DEVICES = ("auto", "cuda", "cpu")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
"""auto: the model's dtype. fp8 (= fp8_e4m3) and fp8_e5m2 store keys and values in 8 bits,
unscaled (vLLM's k_scale = v_scale = 1.0), saturated at the format's largest finite value."""


TOKENIZER_MODES = ("auto", "hf")
LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")
"""vLLM's --tokenizer-mode values loom runs: both mean the tokenizer.json that the
`tokenizers` library reads (vLLM's "hf": the Hugging Face fast tokenizer, which "auto" picks
for every model loom serves)."""

SAFETENSORS_LOAD_STRATEGIES = ("lazy", "eager")
RUNNERS = ("auto", "generate", "pooling")
"""vLLM's --runner values loom runs (`loom.tasks`): auto picks by architecture."""
CONVERTS = ("auto", "none", "embed", "classify")
"""vLLM's --convert values loom takes (classify only for classifier checkpoints)."""


DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16",
                 "fp32": "float32"}
"""vLLM's other spellings (a torch.dtype is accepted too: `torch.float16` names one)."""


@dataclass(frozen=True)
class ModelConfig:
    model: str
    """Path to a Hugging Face model directory, a `.gguf` file, a `config.json`, the name
    of a shipped benchmark config (e.g. `llama-3.1-8b`), or a Hugging Face Hub id found in
    the local cache, which becomes its snapshot folder here (`loom.models.names`)."""
    tokenizer: str | None = None
    """Tokenizer directory or file (or a Hub id, as model); defaults to the model's own."""
    dtype: str = "auto"
    """Weight and activation dtype: auto (the checkpoint's, float32 on CPU), bfloat16,
    float16 or float32."""
    max_model_len: int | None = None
    """Longest prompt + output, in tokens; defaults to the model's context length."""
    load_format: str = "auto"
    """auto (by file type), safetensors, gguf, or dummy (random weights from the config)."""
    seed: int = 0
    """Seed for dummy weights and for requests that give no seed of their own."""
    generation_config: str = "auto"
    """Where requests' sampling defaults come from (vLLM's --generation-config): "auto", the
    model directory's generation_config.json; "vllm", none (SamplingParams' own); else a
    directory whose generation_config.json is read instead, its EOS ids included."""
    quantization: str | None = None
    """vLLM's --quantization: None (the checkpoint's own quantization_config, if any),
    "fp8" (weights quantized to fp8 at load, or an fp8 checkpoint), or a checkpoint format:
    "compressed-tensors" (fp8 or int4), "awq", "gptq"; `loom.quantization.config`."""
    max_logprobs: int = 20
    """The most top logprobs a request may ask for at each position (logprobs, prompt
    logprobs, chat's top_logprobs); -1: the whole vocabulary. vLLM's default (OpenAI's)."""
    logprobs_mode: str = "raw_logprobs"
    """vLLM's --logprobs-mode, what logprobs (and prompt logprobs) hold: raw_logprobs (the
    model's own distribution, vLLM's default), raw_logits, or processed_logprobs /
    processed_logits (after everything the sampler applies: grammar, allowed tokens,
    logit_bias, penalties, min_tokens, temperature, top-k, top-p, min-p). A prompt has no
    sampling: its logprobs are the raw ones (logits in either logits mode)."""
    hf_overrides: dict[str, Any] = field(default_factory=dict)
    """vLLM's --hf-overrides: keys set over the model's config.json (a GGUF file's config
    too) before anything reads it, each replacing the file's value whole; a nested config
    (a dict holding its own model_type, such as text_config) is updated key by key."""
    override_generation_config: dict[str, Any] = field(default_factory=dict)
    """vLLM's --override-generation-config: generation_config.json keys (temperature,
    top_p, top_k, min_p, repetition_penalty, max_new_tokens) set over the file's sampling
    defaults, or alone under generation_config "vllm"; null unsets one."""
    tokenizer_mode: str = "auto"
    """vLLM's --tokenizer-mode, one of TOKENIZER_MODES."""
    runner: str = "auto"
    """vLLM's --runner: generate, pooling (embeddings, classification, scoring: nothing is
    generated), or auto (pooling for *ForSequenceClassification, else generate)."""
    convert: str = "auto"
    """vLLM's --convert: embed serves a causal LM as an embedding model (pooling only)."""
    pooler_config: dict[str, Any] = field(default_factory=dict)
    """vLLM's --pooler-config: the server's pooling defaults (`loom.pooler_config`)."""
    revision: str | None = None
    """vLLM's --revision: the branch, tag or full commit id of a Hub id's cached snapshot
    (None: main). Unused for a local path."""
    tokenizer_revision: str | None = None
    """vLLM's --tokenizer-revision, for a Hub id given as tokenizer (None: revision's)."""
    download_dir: str | None = None
    """vLLM's --download-dir: the Hugging Face cache folder Hub ids are looked up in (None:
    huggingface_hub's default). loom never downloads into it."""
    hf_config_path: str | None = None
    """vLLM's --hf-config-path: the config.json read in place of the model's (a file, or a
    directory holding one); the weights stay the model's."""
    ignore_patterns: tuple[str, ...] = ("original/**/*",)
    """vLLM's --ignore-patterns: weight files (paths under the model directory) never read;
    the default skips Llama checkpoints' original/ copies."""
    safetensors_load_strategy: str = "lazy"
    disable_sliding_window: bool = False
    """vLLM's: a model trained with a sliding window runs sequences no longer than it (its
    context length becomes the window's)."""
    """vLLM's: "lazy" maps each file and reads tensors as they load; "eager" reads each
    file whole first (network filesystems, where scattered reads are slow)."""
    enable_sleep_mode: bool = False
    """vLLM's --enable-sleep-mode: weights and KV cache in memory a sleep can free
    (`loom.worker.sleep_memory`); LLM.sleep / wake_up, and the server's /sleep."""
    logits_processors: tuple[Any, ...] = ()
    """vLLM's --logits-processors: custom logits processor classes (`loom.logits_processor`),
    or their "module.path:ClassName" names (typed Any: msgspec decodes no str | type), run
    on every step's logits; those of installed `loom.logits_processors` entry points join."""

    def __post_init__(self) -> None:
        _check(isinstance(self.model, str) and bool(self.model),
               "model: must name a model path or a shipped config")
        for name in ("hf_overrides", "override_generation_config", "pooler_config"):
            object.__setattr__(self, name, json_object(getattr(self, name), name))
        check_pooler_config(self.pooler_config)
        for name in ("logits_processors", "ignore_patterns"):
            object.__setattr__(self, name, name_list(getattr(self, name), name,
                                                     allow_types=name == "logits_processors"))
        _check(self.safetensors_load_strategy in SAFETENSORS_LOAD_STRATEGIES,
               f"safetensors_load_strategy: {self.safetensors_load_strategy!r} is not one of "
               f"{SAFETENSORS_LOAD_STRATEGIES} (torchao's is not loom's)")
        _check(self.tokenizer_mode in TOKENIZER_MODES,
               f"tokenizer_mode: {self.tokenizer_mode!r} is not supported; loom reads "
               "tokenizer.json with the `tokenizers` library (the fast tokenizer): use "
               f"{' or '.join(TOKENIZER_MODES)}")
        _check(self.runner in RUNNERS, f"runner: {self.runner!r} is not one of {RUNNERS} "
               "(a draft model is named in --speculative-config, not served by itself)")
        _check(self.convert in CONVERTS, f"convert: {self.convert!r} is not one of {CONVERTS} "
               "(loom serves no reward models)")
        _check(isinstance(self.generation_config, str) and bool(self.generation_config),
               "generation_config: must be 'auto', 'vllm' or a directory, got "
               f"{self.generation_config!r}")
        _check(type(self.max_logprobs) is int and self.max_logprobs >= -1,
               f"max_logprobs: must be an integer >= -1 (-1: the whole vocabulary), got "
               f"{self.max_logprobs!r}")
        _check(self.logprobs_mode in LOGPROBS_MODES, f"logprobs_mode: {self.logprobs_mode!r} "
                                                     f"is not one of {LOGPROBS_MODES}")
        name = str(self.dtype).removeprefix("torch.")
        object.__setattr__(self, "dtype", DTYPE_ALIASES.get(name, name))
        _check(self.dtype in DTYPES, f"dtype: {self.dtype!r} is not one of {DTYPES} "
                                     f"(or {sorted(DTYPE_ALIASES)})")
        _check(self.load_format in LOAD_FORMATS,
               f"load_format: {self.load_format!r} is not one of {LOAD_FORMATS}")
        _check(self.max_model_len is None or self.max_model_len > 0,
               f"max_model_len: must be positive, got {self.max_model_len}")
        _check(self.quantization is None or self.quantization in QUANTIZATIONS,
               f"quantization: {self.quantization!r} is not supported; loom runs "
               f"{', '.join(QUANTIZATIONS)}")
        from loom.models.names import resolved_names  # Hub ids: their cached snapshots
        model, tokenizer = resolved_names(self)
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "tokenizer", tokenizer)


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
    num_gpu_blocks_override: int | None = None
    """vLLM's: this many KV blocks, whatever the memory budget allowed (to test preemption
    with a small cache, say)."""
    prefix_caching_hash_algo: str = "builtin"
    """vLLM's: builtin (Python's 64-bit hash) or sha256 (collision-resistant)."""

    def __post_init__(self) -> None:
        blocks = self.num_gpu_blocks_override
        _check(blocks is None or (isinstance(blocks, int) and not isinstance(blocks, bool)
                                  and blocks > 0),
               "num_gpu_blocks_override: must be a positive integer, got "
               f"{self.num_gpu_blocks_override!r}")
        _check(self.prefix_caching_hash_algo in ("builtin", "sha256"),
               "prefix_caching_hash_algo: must be builtin or sha256, got "
               f"{self.prefix_caching_hash_algo!r}")
        _check(self.cache_dtype in KV_CACHE_DTYPES,
               f"kv_cache_dtype: {self.cache_dtype!r} is not one of {KV_CACHE_DTYPES}")
        _check(self.block_size > 0 and self.block_size & (self.block_size - 1) == 0,
               f"block_size: must be a positive power of two, got {self.block_size}")
        _check(0.0 < self.gpu_memory_utilization <= 1.0,
               f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")
        _check(self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes > 0,
               f"kv_cache_memory_bytes: must be positive, got {self.kv_cache_memory_bytes}")


USAGE_CONTEXTS = ("llm", "api_server")
SCHEDULING_POLICIES = ("fcfs", "priority")

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
    depends on host-side token values (guided decoding, penalties, bad words, pending
    min_tokens) wait for their result instead; a seeded request's draw needs only its
    output count, which the worker knows, so it runs ahead too."""
    usage_context: str = "llm"
    """Who drives the engine, "llm" (offline, benchmarks) or "api_server": picks the
    defaults above."""
    kv_headroom_tokens: int = 512
    """KV blocks kept for decoding at admission: a waiting request is admitted only while
    the free blocks can still hold, for it and for every running request, the tokens each
    may yet generate (its max_tokens less what it has), counting at most this many each.
    Without it (0, vLLM's policy) a full batch admitted while prompts fit runs out of blocks
    as it decodes and preempts requests, which are then recomputed from the start."""
    scheduling_policy: str = "fcfs"
    """vLLM's: "fcfs" serves requests in arrival order; "priority" by each request's
    priority (lower first), then arrival, and preempts the lowest-ranked running one
    (`loom.core.request_queue`)."""

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
        _check(self.scheduling_policy in SCHEDULING_POLICIES,
               f"scheduling_policy: {self.scheduling_policy!r} is not one of "
               f"{SCHEDULING_POLICIES}")

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


EXECUTOR_BACKENDS = ("mp", "uni")
"""vLLM's --distributed-executor-backend values loom has: mp, a worker process per rank
(`loom.executor.multiproc`); uni, the one worker in the engine core's process."""

_NO_EXECUTOR = {"ray": "loom has no Ray executor: its workers are processes on this machine "
                       "(mp)",
                "external_launcher": "loom starts its own worker processes (mp); it does not "
                                     "run under torchrun"}


@dataclass(frozen=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    """Number of devices (or CPU processes) a model is sharded over."""
    pipeline_parallel_size: int = 1
    """vLLM's -pp; loom shards by tensor parallelism only, so 1 (as scripts pass it)."""
    data_parallel_size: int = 1
    """vLLM's -dp: `loom serve` runs this many engine cores, each a whole replica of the
    model on its own tensor_parallel_size devices, and spreads requests over them."""
    distributed_executor_backend: str | None = None
    """One of EXECUTOR_BACKENDS; None: uni for one rank, mp for more (as vLLM picks)."""
    disable_custom_all_reduce: bool = False
    """vLLM's: every TP all-reduce through NCCL, never loom's kernels over symmetric memory
    (the one-shot all-reduce and the fused all-reduce + add + RMSNorm of decode steps)."""
    worker_extension_cls: str = ""
    """vLLM's: module.Class whose methods join every worker's (`loom.worker.extension`)."""

    def __post_init__(self) -> None:
        _check(self.tensor_parallel_size > 0,
               f"tensor_parallel_size: must be positive, got {self.tensor_parallel_size}")
        _check(self.pipeline_parallel_size == 1,
               "pipeline_parallel_size: loom has no pipeline parallelism (only 1 is accepted, "
               f"got {self.pipeline_parallel_size!r}); shard the model with -tp")
        _check(isinstance(self.worker_extension_cls, str), "worker_extension_cls: must be "
               f"a module.Class name, got {self.worker_extension_cls!r}")
        _check(self.data_parallel_size > 0,
               f"data_parallel_size: must be positive, got {self.data_parallel_size}")
        backend = self.distributed_executor_backend
        _check(backend is None or backend in EXECUTOR_BACKENDS,
               f"distributed_executor_backend: {backend!r} is not supported: "
               f"{_NO_EXECUTOR.get(backend, 'loom runs mp or uni')}")
        _check(backend != "uni" or self.tensor_parallel_size == 1,
               "distributed_executor_backend: uni runs one worker in the engine core's "
               f"process; tensor_parallel_size {self.tensor_parallel_size} needs mp")

    def check_one_engine(self, where: str) -> None:
        """ValueError unless one engine core serves: `where` runs its engine in-process."""
        _check(self.data_parallel_size == 1,
               f"data_parallel_size: {where} runs one engine core in this process (got "
               f"{self.data_parallel_size}); `loom serve -dp N` runs N replicas, or run one "
               "LLM per device")

    @property
    def worker_processes(self) -> bool:
        """Whether each rank runs in a worker process of its own (else in the engine core)."""
        if self.distributed_executor_backend is None:
            return self.tensor_parallel_size > 1
        return self.distributed_executor_backend == "mp"


@dataclass(frozen=True)
class DeviceConfig:
    device: str = "auto"
    """auto (cuda when available), cuda or cpu."""

    def __post_init__(self) -> None:
        _check(self.device in DEVICES, f"device: {self.device!r} is not one of {DEVICES}")


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
    speculative: SpeculativeConfig | None = None
    """Speculative decoding (vLLM's --speculative-config); None: off."""
    lora: LoRAConfig | None = None
    """LoRA adapters (vLLM's --enable-lora); None: requests may not name one."""

    def __post_init__(self) -> None:
        draft_tp, tp = (self.speculative and self.speculative.draft_tensor_parallel_size,
                        self.parallel.tensor_parallel_size)
        _check(draft_tp in (None, 1, tp),
               f"speculative_config.draft_tensor_parallel_size: 1 (the whole draft model on "
               f"the driver's GPU) or the target's tensor_parallel_size ({tp}), got {draft_tp}")
        _check(self.speculative is None or self.model.logprobs_mode == "raw_logprobs",
               f"logprobs_mode: {self.model.logprobs_mode!r} is not supported with "
               "speculative decoding (its verified drafts report raw_logprobs)")
        procs, pooling = self.model.logits_processors, self.model.runner == "pooling"
        _check(not (procs and (self.speculative or pooling)),
               "logits_processors: not supported with speculative decoding or --runner pooling "
               "(as in vLLM)")
