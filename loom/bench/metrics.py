"""Aggregate the per-request outcomes of a serving run and print the result block."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from loom.bench.client import RequestOutcome
from loom.bench.common import percentiles

METRICS = ("ttft", "tpot", "itl", "e2el")
_TITLES = {"ttft": ("Time to First Token", "TTFT"),
           "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
           "itl": ("Inter-token Latency", "ITL"),
           "e2el": ("End-to-end Latency", "E2EL")}
_WIDTH = 50


@dataclass(frozen=True)
class MetricStats:
    mean_ms: float
    median_ms: float
    std_ms: float
    percentiles_ms: dict[str, float]


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    token_count_source: str
    """usage (every request reported it), chunks (none did: events counted) or mixed."""
    stats: dict[str, MetricStats] = field(default_factory=dict)
    request_goodput: float | None = None
    """Requests per second that met every --goodput objective (None: none set)."""


def metric_values(outcomes: Sequence[RequestOutcome]) -> dict[str, list[float]]:
    """Seconds, over successful requests: one value per request, ITL one per gap."""
    ok = [o for o in outcomes if o.success]
    return {"ttft": [o.ttft for o in ok],
            "tpot": [o.tpot for o in ok if o.tpot is not None],
            "itl": [gap for o in ok for gap in o.itl],
            "e2el": [o.latency for o in ok]}


def stats_ms(values_s: Sequence[float], points: Sequence[float]) -> MetricStats:
    ms = np.asarray(values_s, dtype=np.float64) * 1e3
    if ms.size == 0:
        return MetricStats(0.0, 0.0, 0.0, percentiles([], points))
    return MetricStats(float(ms.mean()), float(np.median(ms)), float(ms.std()),
                       percentiles(ms.tolist(), points))


def _token_source(ok: Sequence[RequestOutcome]) -> str:
    from_usage = sum(o.tokens_from_usage for o in ok)
    if from_usage == len(ok):
        return "usage"
    return "chunks" if from_usage == 0 else "mixed"


GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """vLLM's --goodput: "ttft:500" "tpot:50" "e2el:2000", milliseconds each."""
    slos: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition(":")
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if name not in GOODPUT_METRICS or not ms > 0:
            raise ValueError(f"goodput: {item!r} is not NAME:MILLISECONDS with NAME one of "
                             f"{GOODPUT_METRICS} and a positive number")
        slos[name] = ms
    return slos


def _good(o: RequestOutcome, slos: dict[str, float]) -> bool:
    """Whether a successful request met every objective (a one-token output's TPOT is 0)."""
    values = {"ttft": o.ttft, "tpot": o.tpot or 0.0, "e2el": o.latency}
    return all(values[name] * 1e3 <= ms for name, ms in slos.items())


def compute_metrics(outcomes: Sequence[RequestOutcome], duration_s: float,
                    points: Sequence[float],
                    goodput: dict[str, float] | None = None) -> BenchmarkMetrics:
    """goodput: --goodput's objectives (milliseconds); request_goodput counts the
    successful requests that met them all."""
    ok = [o for o in outcomes if o.success]
    inputs = sum(o.input_tokens for o in ok)
    outputs = sum(o.output_tokens for o in ok)
    values = metric_values(outcomes)
    return BenchmarkMetrics(
        completed=len(ok), failed=len(outcomes) - len(ok), duration_s=duration_s,
        total_input_tokens=inputs, total_output_tokens=outputs,
        request_throughput=len(ok) / duration_s, output_throughput=outputs / duration_s,
        total_token_throughput=(inputs + outputs) / duration_s, token_count_source=_token_source(ok),
        stats={name: stats_ms(values[name], points) for name in METRICS},
        request_goodput=(sum(_good(o, goodput) for o in ok) / duration_s
                         if goodput else None))


def _row(label: str, value: float | int, fmt: str = ".2f") -> str:
    return f"{label:<40}{value:<10{fmt}}"


def result_lines(m: BenchmarkMetrics, selected: Sequence[str]) -> list[str]:
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=_WIDTH, c="="),
             _row("Successful requests:", m.completed, "d"),
             _row("Failed requests:", m.failed, "d"),
             _row("Benchmark duration (s):", m.duration_s),
             _row("Total input tokens:", m.total_input_tokens, "d"),
             _row("Total generated tokens:", m.total_output_tokens, "d"),
             _row("Request throughput (req/s):", m.request_throughput)]
    if m.request_goodput is not None:
        lines.append(_row("Request goodput (req/s):", m.request_goodput))
    lines += [_row("Output token throughput (tok/s):", m.output_throughput),
              _row("Total token throughput (tok/s):", m.total_token_throughput)]
    for name in selected:
        title, short = _TITLES[name]
        s = m.stats[name]
        lines.append("{s:{c}^{n}}".format(s=title, n=_WIDTH, c="-"))
        lines.append(_row(f"Mean {short} (ms):", s.mean_ms))
        lines.append(_row(f"Median {short} (ms):", s.median_ms))
        lines += [_row(f"P{p} {short} (ms):", v) for p, v in s.percentiles_ms.items()]
    lines.append("=" * _WIDTH)
    return lines


def print_result(m: BenchmarkMetrics, selected: Sequence[str]) -> None:
    print("\n".join(result_lines(m, selected)))
    if m.token_count_source != "usage":
        print(f"Note: generated tokens counted from stream chunks for some requests "
              f"({m.token_count_source}): the server sent no usage; a chunk may hold several tokens")
