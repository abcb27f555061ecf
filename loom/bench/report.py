"""A serving run's record: the compute floor (when asked), the result JSON and the PNG."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loom.bench.common import (
    command_line,
    git_commit,
    now_iso,
    shipped_hf_config,
    write_json,
)
from loom.bench.floors import throughput_floor_s
from loom.models.arch import ModelArch

if TYPE_CHECKING:
    from loom.bench.client import RequestOutcome
    from loom.bench.serve import ServeRun


@dataclass(frozen=True)
class FloorInputs:
    arch: ModelArch
    matmul_tflops: float
    device: str | None = None
    """The GPU the matmul rate was measured on (this host's first)."""


def finish_run(run: ServeRun, floor_inputs: FloorInputs | None) -> ServeRun:
    cfg = run.config
    floor = compute_floor(run, floor_inputs) if floor_inputs is not None else None
    run.result = result_payload(run, floor)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = cfg.result_filename or default_filename(run, stamp)
    if cfg.save_result:
        run.json_path = write_json(Path(cfg.result_dir) / name, run.result)
        print(f"Wrote {run.json_path}")
    if cfg.plot:
        from loom.bench.plot import plot_results
        target = (Path(cfg.result_dir) / name).with_suffix(".png")
        run.plot_path = plot_results(run.outcomes, target, _title(run))
        print(f"Wrote {run.plot_path}")
    return run


def default_filename(run: ServeRun, stamp: str) -> str:
    model = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(run.model).name) or "model"
    return f"serve-{run.config.dataset.name}-{_rate(run.config.request_rate)}qps-{model}-{stamp}.json"


def _rate(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def _title(run: ServeRun) -> str:
    m = run.metrics
    return (f"{run.model} @ {_rate(run.config.request_rate)} req/s, {m.completed} requests, "
            f"{m.output_throughput:.0f} output tok/s")


def model_arch(model: str) -> ModelArch:
    hf_config = shipped_hf_config(model)
    if hf_config is None:
        path = Path(model)
        config = path / "config.json" if path.is_dir() else path
        if config.suffix != ".json" or not config.is_file():
            raise ValueError(f"compute_floor: {model!r} is not a shipped config, a config.json or "
                             "a model directory; cannot tell its shapes")
        hf_config = json.loads(config.read_text())
    return ModelArch.from_hf_config(hf_config)


def compute_floor(run: ServeRun, inputs: FloorInputs) -> dict[str, Any]:
    """Runtime against all tokens x 2 x num_params at the measured matmul rate (over tp)."""
    arch, matmul_tflops = inputs.arch, inputs.matmul_tflops
    tokens = run.metrics.total_input_tokens + run.metrics.total_output_tokens
    tp = run.config.tensor_parallel_size
    floor = throughput_floor_s(arch, tokens, matmul_tflops, tp)
    ratio = run.metrics.duration_s / floor
    print(f"Compute floor: {floor:.3f} s ({tokens} tokens x 2 x {arch.num_params / 1e9:.3f}B params "
          f"at {matmul_tflops:.0f} TFLOP/s, tp={tp}); duration / floor = {ratio:.2f}x")
    return {"device": inputs.device, "matmul_tflop_per_s": matmul_tflops,
            "num_params": arch.num_params,
            "tensor_parallel_size": tp, "total_tokens": tokens, "floor_s": floor,
            "duration_ratio_to_floor": ratio}


def request_record(o: RequestOutcome) -> dict[str, Any]:
    return {"success": o.success, "error": o.error, "start_s": o.start,
            "prompt_len": o.prompt_len, "input_tokens": o.input_tokens,
            "output_tokens": o.output_tokens, "tokens_from_usage": o.tokens_from_usage,
            "ttft_s": o.ttft, "tpot_s": o.tpot, "e2el_s": o.latency, "itl_s": o.itl}


def result_payload(run: ServeRun, floor: dict[str, Any] | None) -> dict[str, Any]:
    cfg = run.config
    payload: dict[str, Any] = {
        "benchmark": "serve", "date": now_iso(), "git_commit": git_commit(),
        "command": command_line(), "base_url": cfg.base_url, "endpoint": cfg.endpoint,
        "model": run.model, "tokenizer": run.tokenizer}
    if run.server_info is not None:
        payload["server_info"] = run.server_info
    payload.update({
        "dataset": dataclasses.asdict(cfg.dataset), "request_rate": _rate(cfg.request_rate),
        "burstiness": cfg.burstiness, "max_concurrency": cfg.max_concurrency,
        "ignore_eos": cfg.ignore_eos, "sampling": cfg.sampling, "goodput_ms": cfg.goodput,
        "metadata": cfg.metadata, **cfg.extra_info,
        **dataclasses.asdict(run.metrics), "compute_floor": floor,
        "requests": [request_record(o) for o in run.outcomes]})
    return payload
