"""`loom bench serve`: load an OpenAI-compatible server over HTTP and measure it from the client.

Works against any server that streams `/v1/completions` or `/v1/chat/completions` (loom, vLLM,
...). Requests arrive as a Poisson process at `--request-rate` (gamma with `--burstiness`),
every one streamed; TTFT, TPOT, ITL and end-to-end latency are measured here, output tokens
taken from the server's usage. `--endpoint /v1/embeddings` sends each prompt as an
embedding input instead (an embedding model's server): request and input-token
throughput, and end-to-end latency. One short request is sent first, untimed, to check the
server answers (and to warm it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from loom.bench.client import (
    CHAT_ENDPOINT,
    COMPLETIONS_ENDPOINT,
    EMBEDDINGS_ENDPOINT,
    ENDPOINTS,
    RequestInput,
    RequestOutcome,
    send_request,
)
from loom.bench.common import default_tokenizer
from loom.bench.datasets import (
    DatasetConfig,
    add_dataset_args,
    dataset_config,
    sample_requests,
)
from loom.bench.metrics import METRICS, BenchmarkMetrics, compute_metrics, print_result
from loom.bench.serve_options import (add_request_options, goodput_objectives, metadata,
                                      sampling_fields)
from loom.bench.traffic import arrival_times, drive
from loom.entrypoints.cli_client import check_http_url
from loom.frontend.tokenizer import load_tokenizer
from loom.models.names import resolve_name

_TIMEOUT = aiohttp.ClientTimeout(total=6 * 3600)


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="benchmark a running OpenAI-compatible server")
    g = p.add_argument_group("server")
    g.add_argument("--base-url", default=None, help="e.g. http://127.0.0.1:8000 (overrides --host/--port)")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--model", default=None, help="model name sent in requests (default: the "
                   "server's first from /v1/models); a shipped config name also picks the tokenizer")
    g.add_argument("--tokenizer", default=None,
                   help="tokenizer directory, .gguf or cached Hub id for the prompts")
    g.add_argument("--lora-modules", nargs="+", default=None, metavar="NAME",
                   help="LoRA adapter names the server was started with (--lora-modules): "
                   "each request names one of them at random, as vLLM's benchmark")
    g.add_argument("--num-prompts", type=int, default=1000)
    g.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests per second (Poisson arrivals); inf sends all at once")
    g.add_argument("--save-result", action="store_true", help="write the results as JSON")
    g.add_argument("--result-filename", default=None)
    g.add_argument("--compute-floor", action="store_true",
                   help="measure this machine's CUDA matmul rate and compare the run with the "
                        "compute floor of --model's shapes")
    g.add_argument("-tp", "--tensor-parallel-size", type=int, default=1,
                   help="the server's tensor parallelism, for --compute-floor")
    add_workload_args(p)
    p.set_defaults(func=run_serve)


def add_workload_args(p: argparse.ArgumentParser, result_dir: str | None = ".") -> None:
    """What `loom bench serve` and `loom bench sweep` share."""
    g = p.add_argument_group("workload")
    g.add_argument("--backend", default=None, choices=tuple(BACKENDS),
                   help="vLLM's names for what is sent: vllm and openai post completions, "
                        "openai-chat chat completions, openai-embeddings embeddings "
                        "(default: --endpoint's, else vllm)")
    g.add_argument("--endpoint", default=None, choices=ENDPOINTS,
                   help="the path posted to (default: --backend's, else /v1/completions)")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the arrival gaps: 1 = Poisson, <1 burstier")
    g.add_argument("--max-concurrency", type=int, default=None, help="cap on requests in flight")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--ignore-eos", action="store_true",
                   help="every request generates its full output length (also sets min_tokens)")
    g.add_argument("--percentile-metrics", default=None,
                   help="comma-separated, of ttft,tpot,itl,e2el (the default; for "
                        "/v1/embeddings e2el alone, the only one that applies)")
    g.add_argument("--metric-percentiles", default="50,90,99")
    g.add_argument("--result-dir", default=result_dir)
    g.add_argument("--plot", action="store_true", help="write a PNG of latency CDFs and tokens/s")
    g.add_argument("--api-key", default=None, help="bearer key (default: $OPENAI_API_KEY)")
    add_request_options(g)
    add_dataset_args(p)


@dataclass(frozen=True)
class ServeBenchConfig:
    base_url: str
    endpoint: str
    model: str | None
    tokenizer: str | None
    dataset: DatasetConfig
    request_rate: float
    burstiness: float = 1.0
    max_concurrency: int | None = None
    ignore_eos: bool = False
    percentile_metrics: tuple[str, ...] = METRICS
    metric_percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)
    save_result: bool = False
    result_dir: str = "."
    result_filename: str | None = None
    plot: bool = False
    api_key: str | None = None
    compute_floor: bool = False
    tensor_parallel_size: int = 1
    lora_modules: tuple[str, ...] = ()
    """Adapter names; each request's `model` is one of them, drawn with the dataset's seed."""
    sampling: dict[str, Any] = field(default_factory=dict)
    """Sampling fields sent with every request (serve_options.sampling_fields)."""
    goodput: dict[str, float] = field(default_factory=dict)
    """Objectives in milliseconds by metric (ttft, tpot, e2el); empty: no goodput."""
    metadata: dict[str, str] = field(default_factory=dict)
    ready_check_timeout_s: float = 0.0
    """How long to wait for the server to accept a connection (0: one try)."""
    extra_info: dict[str, Any] = field(default_factory=dict)
    """Recorded as is in the result JSON (the sweep puts its mode and rate here)."""
    after_probe: Callable[[], None] | None = None
    """Called once the untimed probe has answered, before the timed requests (the sweep
    reads the server's histograms there, so that they count the timed requests only)."""

    def __post_init__(self) -> None:
        check_base_url(self.base_url)
        unknown = set(self.percentile_metrics) - set(METRICS)
        if unknown:
            raise ValueError(f"percentile_metrics: {sorted(unknown)} not among {METRICS}")
        if self.endpoint == EMBEDDINGS_ENDPOINT and set(self.percentile_metrics) - {"e2el"}:
            raise ValueError(f"percentile_metrics: {EMBEDDINGS_ENDPOINT} answers once, with "
                             "no tokens to time: e2el alone applies, got "
                             f"{','.join(self.percentile_metrics)}")
        if any(not 0 < p < 100 for p in self.metric_percentiles):
            raise ValueError(f"metric_percentiles: each must be in (0, 100), got {self.metric_percentiles}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency: must be at least 1, got {self.max_concurrency}")
        if self.request_rate <= 0 or self.burstiness <= 0:
            raise ValueError("request_rate and burstiness: must be positive")
        if self.endpoint == EMBEDDINGS_ENDPOINT and set(self.goodput) - {"e2el"}:
            raise ValueError(f"goodput: {EMBEDDINGS_ENDPOINT} has no tokens to time: e2el "
                             "alone applies")

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ServeBenchConfig:
        base = ns.base_url or f"http://{ns.host}:{ns.port}"
        check_base_url(base)  # as given (the config's own check sees it without a final /)
        endpoint = resolve_endpoint(ns.backend, ns.endpoint)
        return cls(
            base_url=base.rstrip("/"), endpoint=endpoint, model=ns.model, tokenizer=ns.tokenizer,
            dataset=dataset_config(ns, ns.num_prompts, ns.seed), request_rate=ns.request_rate,
            burstiness=ns.burstiness, max_concurrency=ns.max_concurrency, ignore_eos=ns.ignore_eos,
            percentile_metrics=_names(ns.percentile_metrics) if ns.percentile_metrics
            else ("e2el",) if endpoint == EMBEDDINGS_ENDPOINT else METRICS,
            metric_percentiles=_floats(ns.metric_percentiles), save_result=ns.save_result,
            result_dir=ns.result_dir, result_filename=ns.result_filename, plot=ns.plot,
            api_key=ns.api_key or os.environ.get("OPENAI_API_KEY"),
            compute_floor=ns.compute_floor, tensor_parallel_size=ns.tensor_parallel_size,
            lora_modules=tuple(ns.lora_modules or ()), sampling=sampling_fields(ns),
            goodput=goodput_objectives(ns), metadata=metadata(ns),
            ready_check_timeout_s=getattr(ns, "ready_check_timeout_sec", 0.0))


def check_base_url(url: str) -> None:
    check_http_url(url, "base_url", "http://127.0.0.1:8000")


BACKENDS = {"vllm": COMPLETIONS_ENDPOINT, "openai": COMPLETIONS_ENDPOINT,
            "openai-chat": CHAT_ENDPOINT, "openai-embeddings": EMBEDDINGS_ENDPOINT}
"""vLLM's `--backend` names for the APIs it shares with loom, and the path each posts to."""


def resolve_endpoint(backend: str | None, endpoint: str | None) -> str:
    """The path posted to: --endpoint, else --backend's; both given must agree."""
    if backend is None:
        return endpoint or COMPLETIONS_ENDPOINT
    if endpoint is not None and endpoint != BACKENDS[backend]:
        raise ValueError(f"backend: {backend} posts to {BACKENDS[backend]}, not --endpoint "
                         f"{endpoint}; drop one of them")
    return BACKENDS[backend]


def _names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(s) for s in _names(text))
    except ValueError as e:
        raise ValueError(f"metric_percentiles: {text!r} is not a comma-separated list of numbers") from e


@dataclass
class ServeRun:
    config: ServeBenchConfig
    model: str
    tokenizer: str
    metrics: BenchmarkMetrics
    outcomes: list[RequestOutcome]
    server_info: dict[str, Any] | None
    result: dict[str, Any] = field(default_factory=dict)
    json_path: Path | None = None
    plot_path: Path | None = None


def run_serve(args: argparse.Namespace) -> int:
    run = run_benchmark(ServeBenchConfig.from_args(args))
    return 0 if run.metrics.completed > 0 else 1


def run_benchmark(cfg: ServeBenchConfig) -> ServeRun:
    """Run one benchmark, print its result block, save JSON and PNG as configured."""
    from loom.bench.report import FloorInputs, finish_run, model_arch
    if cfg.plot:
        from loom.bench.plot import check_plotting
        check_plotting()
    floor = None
    if cfg.compute_floor:  # shapes and rate before the run, so that a mistake costs nothing
        if cfg.model is None:
            raise ValueError("compute_floor: needs --model (a shipped config name or config path)")
        floor = FloorInputs(model_arch(cfg.model), *_floor_rate())
    run = asyncio.run(_benchmark(cfg))
    print_result(run.metrics, cfg.percentile_metrics)
    return finish_run(run, floor)


async def _benchmark(cfg: ServeBenchConfig) -> ServeRun:
    # Idle connections are dropped before a server's keep-alive timeout (uvicorn: 5 s) could
    # close one under a request: building a large dataset takes longer than that.
    connector = aiohttp.TCPConnector(limit=cfg.max_concurrency or 0, keepalive_timeout=2)
    async with aiohttp.ClientSession(timeout=_TIMEOUT, connector=connector) as session:
        await _wait_ready(session, cfg)
        model = cfg.model or await _served_model(session, cfg)
        tokenizer = cfg.tokenizer or _model_tokenizer(model)
        samples = sample_requests(cfg.dataset, load_tokenizer(
            resolve_name(tokenizer, None, None, "tokenizer", required=True)))
        names = _request_models(model, cfg.lora_modules, len(samples), cfg.dataset.seed)
        inputs = [RequestInput(cfg.base_url + cfg.endpoint, name, s.prompt, s.prompt_len,
                               s.expected_output_len, cfg.endpoint == CHAT_ENDPOINT,
                               cfg.ignore_eos, cfg.api_key, cfg.endpoint == EMBEDDINGS_ENDPOINT,
                               cfg.sampling)
                  for s, name in zip(samples, names)]
        await _probe(session, replace(inputs[0], prompt="Hello", output_len=4))
        if cfg.after_probe is not None:
            cfg.after_probe()
        info = await _server_info(session, cfg)
        offsets = arrival_times(len(inputs), cfg.request_rate, cfg.burstiness,
                                np.random.default_rng(cfg.dataset.seed))
        outcomes, duration = await drive(session, inputs, offsets, cfg.max_concurrency)
    metrics = compute_metrics(outcomes, duration, cfg.metric_percentiles, cfg.goodput)
    return ServeRun(cfg, model, tokenizer, metrics, outcomes, info)


def _request_models(model: str, lora_modules: tuple[str, ...], count: int,
                    seed: int) -> list[str]:
    """The `model` of each request: the base model's, or a random adapter's."""
    if not lora_modules:
        return [model] * count
    rng = random.Random(seed)
    return [rng.choice(lora_modules) for _ in range(count)]


def _model_tokenizer(model: str) -> str:
    try:
        found = default_tokenizer(model)
    except ValueError as e:
        raise ValueError(f"tokenizer: cannot tell which tokenizer {model!r} uses ({e}); "
                         "pass --tokenizer") from e
    if found is None:
        raise ValueError(f"tokenizer: {model!r} ships no tokenizer; pass --tokenizer")
    return found


async def _wait_ready(session: aiohttp.ClientSession, cfg: ServeBenchConfig) -> None:
    """Until the server answers /v1/models at all (any status), for up to
    cfg.ready_check_timeout_s: refused connections are retried each second."""
    url = cfg.base_url + "/v1/models"
    deadline = asyncio.get_running_loop().time() + cfg.ready_check_timeout_s
    waiting = False
    while True:
        try:
            async with session.get(url, headers=_auth(cfg)) as resp:
                await resp.read()
            return
        except aiohttp.ClientConnectionError as e:
            if asyncio.get_running_loop().time() >= deadline:
                raise ValueError(f"server: {cfg.base_url} accepted no connection within "
                                 f"{cfg.ready_check_timeout_s:g} s "
                                 f"(--ready-check-timeout-sec): {e}") from e
            if not waiting:
                print(f"Waiting up to {cfg.ready_check_timeout_s:g} s for {cfg.base_url} "
                      "to accept connections ...", flush=True)
                waiting = True
            await asyncio.sleep(1.0)
        except aiohttp.ClientError as e:  # not a refused connection: waiting will not help
            reason = " ".join(str(e).split())[:300]  # one line (a bad status line spans many)
            raise ValueError(f"server: GET {url} failed: {type(e).__name__}: {reason}") \
                from None


async def _served_model(session: aiohttp.ClientSession, cfg: ServeBenchConfig) -> str:
    url = cfg.base_url + "/v1/models"
    try:
        async with session.get(url, headers=_auth(cfg)) as resp:
            status, body = resp.status, await resp.text()
    except (aiohttp.ClientError, ValueError) as e:
        raise ValueError(f"model: none given and {url} failed: {e}") from e
    if status != 200:  # a 401 (no --api-key) is not "no models"
        raise ValueError(f"model: none given and {url} answered HTTP {status}: "
                         f"{' '.join(body[:500].split())}")
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    data = data if isinstance(data, dict) else {}
    models = [m.get("id") for m in data.get("data") or [] if isinstance(m, dict)]
    if not models:
        raise ValueError(f"model: none given and {cfg.base_url}/v1/models lists none; pass --model")
    return str(models[0])


async def _server_info(session: aiohttp.ClientSession, cfg: ServeBenchConfig) -> dict[str, Any] | None:
    """What the server says about itself at /version, when it says anything."""
    try:
        async with session.get(cfg.base_url + "/version", headers=_auth(cfg)) as resp:
            info = await resp.json() if resp.status == 200 else None
    except (aiohttp.ClientError, ValueError):
        return None
    return info if isinstance(info, dict) else None


async def _probe(session: aiohttp.ClientSession, req: RequestInput) -> None:
    print(f"Checking {req.url} with one short request ...")
    outcome = await send_request(session, req, 0.0)
    if not outcome.success:
        raise ValueError(f"server: the first (untimed) request failed: {outcome.error}")


def _auth(cfg: ServeBenchConfig) -> dict[str, str]:
    return {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}


def _floor_rate() -> tuple[float, str]:
    """The matmul rate of this host's first GPU, and its name."""
    import torch

    from loom.bench.ceilings import device_name, matmul_tflops
    if not torch.cuda.is_available():
        raise ValueError("compute_floor: measures the matmul rate on CUDA, and none is available")
    device = torch.device("cuda", 0)
    return matmul_tflops(device), device_name(device)

