"""Where a loom server's time to first token goes, from its own /metrics.

The server measures, per request: its TTFT (from the engine request's creation in the API
process to the first token there), the engine's queue time (arrival in the engine core to
first scheduling) and prefill time (first scheduling to the first token). Read before and
after a run, the histograms' sums and counts give each one's mean over the run's requests;
what TTFT holds beyond queue + prefill is the path between the processes (ZeroMQ, the
engine's input and output threads, waiting for the engine loop to take the request in, the
API's output processing). The client's TTFT adds HTTP and tokenization to the server's.
"""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

HISTOGRAMS = {"ttft": "loom:time_to_first_token_seconds",
              "queue": "loom:request_queue_time_seconds",
              "prefill": "loom:request_prefill_time_seconds"}

Totals = dict[str, tuple[float, float]]
"""histogram key -> (sum of seconds, count)."""


def read_totals(base_url: str, timeout_s: float = 10.0) -> Totals | None:
    """The histograms' (sum, count) on the server now; None if /metrics does not answer or
    lacks them (not a loom server, or an older one)."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    try:
        return parse_totals(text)
    except ValueError:  # not Prometheus text
        return None


def parse_totals(text: str) -> Totals | None:
    found: dict[str, list[float]] = {}
    names = {v: k for k, v in HISTOGRAMS.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for suffix, slot in (("_sum", 0), ("_count", 1)):
                key = names.get(sample.name.removesuffix(suffix))
                if sample.name.endswith(suffix) and key is not None:
                    found.setdefault(key, [0.0, 0.0])[slot] += sample.value
    if set(found) != set(HISTOGRAMS):
        return None
    return {k: (v[0], v[1]) for k, v in found.items()}


def mean_ms(before: Totals | None, after: Totals | None) -> dict[str, float] | None:
    """Each histogram's mean (ms) over what was observed between the two readings, and
    `between` = TTFT - queue - prefill; None without both readings or new observations."""
    if before is None or after is None:
        return None
    means = {}
    for key in HISTOGRAMS:
        total, count = after[key][0] - before[key][0], after[key][1] - before[key][1]
        if count <= 0:
            return None
        means[key] = 1e3 * total / count
    means["between"] = means["ttft"] - means["queue"] - means["prefill"]
    return means


def describe(means: dict[str, float]) -> str:
    return (f"server side, mean ms: TTFT {means['ttft']:.1f} = engine queue "
            f"{means['queue']:.1f} + prefill {means['prefill']:.1f} + "
            f"{means['between']:.1f} between the API and the engine loop")
