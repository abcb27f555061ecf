"""What the offline benchmarks (latency, throughput) share: engine flags, the engine, the
model's shapes, the ceilings, random token-id prompts and the provenance of the JSON."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from loom.bench.common import command_line, git_commit, now_iso, offline_tokenizer
from loom.engine.arg_utils import EngineArgs
from loom.models.arch import ModelArch

if TYPE_CHECKING:  # torch is imported when a benchmark runs, not when the CLI is built
    from loom.bench.ceilings import Ceilings
    from loom.entrypoints.llm import LLM
    from loom.lora.request import LoRARequest

def add_offline_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output-json", "--output_json", default=None,
                        help="write the results, device, commit and command as JSON here")
    parser.add_argument("--lora-path", "--lora_path", default=None,
                        help="with --enable-lora: a PEFT adapter every request runs with, "
                        "under each of --max-loras ids in turn (as vLLM's benchmark), or "
                        "'dummy': a random one of rank --max-lora-rank on every projection")
    EngineArgs.add_cli_args(parser)


@dataclass
class OfflineBench:
    llm: LLM
    engine_args: EngineArgs
    arch: ModelArch
    dtype_bytes: int
    kv_dtype_bytes: int
    """The KV cache's element size (--kv-cache-dtype)."""
    device: str
    ceilings: Ceilings | None
    vocab_size: int
    """Random prompt ids are drawn from [0, vocab_size)."""
    compilation_level: int
    """The level the model runs at: -O's, else the device's default; 0 under --enforce-eager."""
    loras: list[LoRARequest] | None = None
    """--lora-path's adapter under each of --max-loras ids; None: the base model."""
    fp8: bool = False
    """The linear layers run in fp8 (--quantization, or an fp8 checkpoint), or in int8
    (a W8A8-INT8 checkpoint): one byte a weight, the 8-bit GEMM's rate."""
    int4_bytes: float | None = None
    """Bytes a weight of an int4 checkpoint's linear layers costs (with its scales); None:
    not int4."""
    expert_bytes: float | None = None
    """Bytes an MoE expert's weight costs where only the experts are quantized
    (--quantization experts_int8); None: as linear_bytes."""

    @property
    def linear_bytes(self) -> float:
        """The element size of the weights fp8 or int4 quantizes."""
        if self.int4_bytes is not None:
            return self.int4_bytes
        return 1 if self.fp8 else self.dtype_bytes

    @property
    def matmul_tflops(self) -> float | None:
        """The matmul rate compute floors are held to (fp8's under fp8)."""
        return None if self.ceilings is None else self.ceilings.matmul_rate(self.fp8)

    def lora_requests(self, count: int) -> list[LoRARequest] | None:
        """The adapters of `count` requests: the ids in turn."""
        if self.loras is None:
            return None
        return [self.loras[i % len(self.loras)] for i in range(count)]

    @property
    def tp(self) -> int:
        return self.engine_args.tensor_parallel_size

    def random_prompts(self, rng: np.random.Generator, count: int, length: int) -> list[list[int]]:
        return rng.integers(0, self.vocab_size, size=(count, length)).tolist()

    def provenance(self, benchmark: str) -> dict[str, Any]:
        return {"benchmark": benchmark, "date": now_iso(), "device": self.device,
                "git_commit": git_commit(), "command": command_line(),
                "engine_args": _jsonable(dataclasses.asdict(self.engine_args)),
                "compilation_level": self.compilation_level,
                "ceilings": dataclasses.asdict(self.ceilings) if self.ceilings else None}


def _check_fits(args: argparse.Namespace, max_model_len: int) -> None:
    """Before the engine is built: a request longer than the context would only be cut
    short, and found out after the whole run. Random prompts at their longest (with
    --random-range-ratio); a dataset's requests are checked once sampled."""
    from loom.bench.datasets import length_bounds
    if getattr(args, "dataset_name", "random") != "random":
        return
    ratio = getattr(args, "random_range_ratio", 0.0)
    longest_in = length_bounds(args.input_len, ratio)[1]
    longest_out = length_bounds(args.output_len, ratio)[1]
    total = longest_in + longest_out
    if total > max_model_len:
        raise ValueError(f"input_len + output_len: {longest_in} + {longest_out} = {total} "
                         f"tokens (at their longest) exceed max_model_len ({max_model_len}); "
                         "raise --max-model-len or shorten the request")


HELD_MATMUL_S = 3.0
"""Seconds the offline benchmarks hold the matmul for its held rate (`loom.bench.ceilings`)."""


def setup_offline(args: argparse.Namespace) -> OfflineBench:
    """Measure the ceilings on the idle device, then build the engine."""
    from loom.bench.ceilings import device_name, measure_ceilings
    from loom.models.arch import resolve_max_model_len
    from loom.entrypoints.llm import LLM
    from loom.models.loader import resolve
    from loom.quantization.config import Fp8Scheme, Int4Scheme, quant_scheme
    from loom.worker.model_loader import resolve_dtype, resolve_kv_cache_dtype
    from loom.worker.worker import resolve_device

    engine_args = EngineArgs.from_cli_args(args)
    config = engine_args.create_engine_config()
    arch = ModelArch.from_hf_config(resolve(config.model).hf_config)
    _check_fits(args, resolve_max_model_len(config.model.max_model_len,
                                            arch.max_position_embeddings))
    loras = _lora_requests(args, config, arch)
    if getattr(args, "reference_json", None) and not os.path.isfile(args.reference_json):
        raise ValueError(f"reference_json: no such file: {args.reference_json}")
    device = resolve_device(engine_args.device)
    scheme = quant_scheme(resolve(config.model).hf_config, config.model.quantization)
    fp8 = isinstance(scheme, Fp8Scheme)  # 8-bit layers: fp8, or int8 W8A8
    int8 = fp8 and scheme.dtype == "int8"
    ceilings = measure_ceilings(device, held_s=HELD_MATMUL_S, fp8=fp8 and not int8, int8=int8)
    dtype = resolve_dtype(config.model.dtype, arch.dtype, device)
    dtype_bytes = dtype.itemsize
    int4_bytes = (scheme.bytes_per_weight(dtype_bytes) if isinstance(scheme, Int4Scheme)
                  else None)
    expert_bytes = None
    if isinstance(scheme, Int4Scheme) and scheme.experts_only:
        int4_bytes, expert_bytes = None, scheme.bytes_per_weight(dtype_bytes)
    kv_dtype_bytes = resolve_kv_cache_dtype(config.cache.cache_dtype, dtype).itemsize
    tokenizer, skip = offline_tokenizer(engine_args.model, engine_args.tokenizer)
    kwargs = dataclasses.asdict(engine_args)
    kwargs["tokenizer"] = tokenizer
    llm = LLM(**kwargs, skip_tokenizer_init=skip)
    vocab = llm.engine.get_model_info()["vocab_size"]
    if llm.tokenizer is not None:
        vocab = min(vocab, llm.tokenizer.vocab_size)
    level = 0 if config.enforce_eager else config.compilation.resolved(device.type).level
    return OfflineBench(llm, engine_args, arch, dtype_bytes, kv_dtype_bytes, device_name(device),
                        ceilings, vocab, level, loras, fp8, int4_bytes, expert_bytes)


def _lora_requests(args: argparse.Namespace, config, arch: ModelArch) -> list[LoRARequest] | None:
    from loom.lora.request import LoRARequest
    path = getattr(args, "lora_path", None)
    if path is None:
        return None
    if config.lora is None:
        raise ValueError("lora_path: needs --enable-lora")
    if path == "dummy":
        import tempfile

        from loom.lora.adapter import model_targets
        from loom.lora.dummy import write_dummy_adapter
        path = write_dummy_adapter(model_targets(arch), tempfile.mkdtemp(prefix="loom-lora-"),
                                   config.lora.max_lora_rank)
    return [LoRARequest(f"lora{i}", i, path) for i in range(1, config.lora.max_loras + 1)]

def _jsonable(value: Any) -> Any:
    """Engine args as JSON: a CompilationConfig object becomes its fields."""
    try:
        json.dumps(value)
        return value
    except TypeError:
        pass
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    return repr(value)


def print_ceilings(ceilings: Ceilings | None) -> None:
    if ceilings is None:
        print("Ceilings: skipped (measured on CUDA only); no floor ratios on this device")
        return
    held = ""
    if ceilings.matmul_held_tflop_per_s is not None:
        held = (f"; held {ceilings.matmul_held_s:.0f} s: {ceilings.matmul_held_tflop_per_s:.1f}"
                f" TFLOP/s ({ceilings.matmul_held_tflop_per_s / ceilings.matmul_tflop_per_s:.0%}"
                " of it)")
    print(f"Ceilings on {ceilings.device}: copy {ceilings.copy_tb_per_s:.3f} TB/s (read+write), "
          f"bf16 matmul {ceilings.matmul_tflop_per_s:.1f} TFLOP/s{held}")


def held_ratio(ceilings: Ceilings | None) -> float | None:
    """The held matmul rate over the burst one (a floor at the burst rate, divided by this,
    is the floor at the held rate); None where it was not measured."""
    if ceilings is None or ceilings.matmul_held_tflop_per_s is None:
        return None
    return ceilings.matmul_held_tflop_per_s / ceilings.matmul_tflop_per_s


def check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name}: must be at least 1, got {value}")
