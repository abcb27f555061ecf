"""`--plot`: one PNG with the latency CDFs (TTFT, TPOT, ITL, E2E), output tokens/s over time and
requests in flight.

Tokens over time are placed at the arrival of each token event; when a server packs several
tokens in one chunk, a request's usage-reported tokens are spread evenly over its events.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from loom.bench.client import RequestOutcome
from loom.bench.metrics import METRICS, metric_values

MATPLOTLIB_HINT = "pip install matplotlib (or: pip install -e '.[bench]')"
_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise ValueError(f"plot: --plot needs matplotlib, which is not installed; {MATPLOTLIB_HINT}") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def check_plotting() -> None:
    """Fail before the run, not after it, when --plot cannot work."""
    _pyplot()


def tokens_over_time(outcomes: Sequence[RequestOutcome], bin_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(bin edges in s, output tokens/s in each bin), over successful requests; the last bin
    ends at the last token."""
    times, weights = [], []
    for o in outcomes:
        if not o.success or not o.event_times:
            continue
        per_event = o.output_tokens / len(o.event_times)
        times += [o.start + t for t in o.event_times]
        weights += [per_event] * len(o.event_times)
    if not times:
        return np.zeros(1), np.zeros(0)
    end = max(times)
    edges = np.append(np.arange(0.0, end, bin_s), end) if end > 0 else np.array([0.0, bin_s])
    counts, _ = np.histogram(times, bins=edges, weights=weights)
    return edges, counts / np.diff(edges)


def in_flight(outcomes: Sequence[RequestOutcome]) -> tuple[np.ndarray, np.ndarray]:
    """(times, requests in flight from each time on): +1 at each send, -1 at each end."""
    events = sorted([(o.start, 1) for o in outcomes] + [(o.start + o.latency, -1) for o in outcomes])
    if not events:
        return np.zeros(0), np.zeros(0)
    times, steps = zip(*events)
    return np.asarray(times), np.cumsum(steps)

def plot_results(outcomes: Sequence[RequestOutcome], path: str | Path, title: str) -> Path:
    plt = _pyplot()
    values = metric_values(outcomes)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, name in zip(axes.flat, METRICS):
        ms = np.sort(np.asarray(values[name]) * 1e3)
        if ms.size:
            ax.plot(ms, np.arange(1, ms.size + 1) / ms.size)
        ax.set_title(f"{_LABELS[name]} CDF ({ms.size} samples)")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction")
        ax.grid(alpha=0.3)
    edges, rate = tokens_over_time(outcomes)
    ax = axes.flat[len(METRICS)]
    ax.stairs(rate, edges)
    ax.set_title("Output tokens/s over time (1 s bins)")
    ax.set_xlabel("s since start")
    ax.set_ylabel("tokens/s")
    ax.grid(alpha=0.3)
    times, count = in_flight(outcomes)
    ax = axes.flat[len(METRICS) + 1]
    ax.step(times, count, where="post")
    ax.set_title("Requests in flight")
    ax.set_xlabel("s since start")
    ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target
