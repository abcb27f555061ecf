"""The engine's periodic stats line (vLLM's do_log_stats): throughput, queue, KV, prefix cache.

Also folds per-step `SchedulerStats` into one message's worth: counters are deltas and add
up, gauges (running, waiting, KV usage) take the latest value.
"""

from __future__ import annotations

import itertools
import logging
import time

import msgspec

from loom.engine.protocol import SchedulerStats

logger = logging.getLogger("loom.engine")

_COUNTERS = ("prefix_cache_queries", "prefix_cache_hits", "num_preemptions",
             "num_prompt_tokens", "num_generation_tokens", "spec_num_drafts",
             "spec_num_draft_tokens", "spec_num_accepted_tokens")


def merge_stats(older: SchedulerStats | None, newer: SchedulerStats) -> SchedulerStats:
    """Gauges from `newer`, counters summed."""
    if older is None:
        return newer
    sums = {name: getattr(older, name) + getattr(newer, name) for name in _COUNTERS}
    if older.spec_accepted_per_pos:  # speculative decoding: per draft position
        sums["spec_accepted_per_pos"] = [a + b for a, b in itertools.zip_longest(
            older.spec_accepted_per_pos, newer.spec_accepted_per_pos, fillvalue=0)]
    return msgspec.structs.replace(newer, **sums)


def gauges_only(stats: SchedulerStats) -> SchedulerStats:
    """The same gauges with every counter at zero: safe to send to every client."""
    return msgspec.structs.replace(stats, spec_accepted_per_pos=[],
                                   **dict.fromkeys(_COUNTERS, 0))


class StatsLogger:
    """Logs one line every `interval` seconds while the engine has done something."""

    def __init__(self, interval: float, enabled: bool = True) -> None:
        self.interval = interval
        self.enabled = enabled
        self._since: SchedulerStats | None = None
        self._last_logged: tuple[int, int, float] | None = None
        self._last_time = time.monotonic()

    def record(self, stats: SchedulerStats | None) -> None:
        if not self.enabled or stats is None:
            return
        if self._since is None and time.monotonic() - self._last_time >= self.interval:
            self._last_time = time.monotonic()  # quiet until now: measure from here
        self._since = merge_stats(self._since, stats)

    def seconds_until_due(self) -> float | None:
        """How long the idle engine may block before a line is due; None: no line pending."""
        if not self._has_news():
            return None
        return max(0.0, self._last_time + self.interval - time.monotonic())

    def maybe_log(self) -> None:
        now = time.monotonic()
        if now - self._last_time < self.interval:
            return
        if self._has_news():
            self._log(self._since, now - self._last_time)
        self._since = None
        self._last_time = now

    def _has_news(self) -> bool:
        s = self._since
        if s is None:
            return False
        gauges = (s.num_running, s.num_waiting, round(s.kv_cache_usage, 3))
        return s.num_prompt_tokens > 0 or s.num_generation_tokens > 0 or gauges != self._last_logged

    def _log(self, s: SchedulerStats, elapsed: float) -> None:
        hit_rate = 100.0 * s.prefix_cache_hits / s.prefix_cache_queries if s.prefix_cache_queries else 0.0
        logger.info("Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                    "Running: %d reqs, Waiting: %d reqs, KV cache usage: %.1f%%, "
                    "Prefix cache hit rate: %.1f%%, Preemptions: %d",
                    s.num_prompt_tokens / elapsed, s.num_generation_tokens / elapsed,
                    s.num_running, s.num_waiting, 100.0 * s.kv_cache_usage, hit_rate,
                    s.num_preemptions)
        self._last_logged = (s.num_running, s.num_waiting, round(s.kv_cache_usage, 3))
        if s.spec_num_drafts:
            _log_spec(s, elapsed)


def _log_spec(s: SchedulerStats, elapsed: float) -> None:
    """vLLM's SpecDecoding line: how many drafts the model accepted, and where."""
    per_pos = ", ".join(f"{n / s.spec_num_drafts:.3f}" for n in s.spec_accepted_per_pos)
    logger.info("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: "
                "%.2f tokens/s, Drafted throughput: %.2f tokens/s, Accepted: %d tokens, "
                "Drafted: %d tokens, Per-position acceptance rate: %s, Avg Draft acceptance "
                "rate: %.1f%%", 1 + s.spec_num_accepted_tokens / s.spec_num_drafts,
                s.spec_num_accepted_tokens / elapsed, s.spec_num_draft_tokens / elapsed,
                s.spec_num_accepted_tokens, s.spec_num_draft_tokens, per_pos,
                100.0 * s.spec_num_accepted_tokens / max(1, s.spec_num_draft_tokens))
