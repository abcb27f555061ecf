"""GET /metrics: Prometheus metrics under vLLM's names with a `loom:` prefix.

Engine gauges and counters come from the `SchedulerStats` the engine core sends; latency
histograms are measured here, per request. With several API server processes, the launcher
sets PROMETHEUS_MULTIPROC_DIR: each process writes its samples there and any of them
answers /metrics for all (counters and histograms summed, engine gauges the most recent).
"""

from __future__ import annotations

import os

from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               Histogram, generate_latest)

from loom.engine.protocol import SchedulerStats

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class ServerMetrics:
    """Implements AsyncLLM's StatsSink."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        label = {"model_name": model_name}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"loom:{name}", doc, list(label), registry=self.registry,
                         multiprocess_mode="mostrecent").labels(**label)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"loom:{name}", doc, list(label), registry=self.registry).labels(**label)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"loom:{name}", doc, list(label), registry=self.registry,
                             buckets=buckets).labels(**label)

        self.running = gauge("num_requests_running", "Requests the engine is running.")
        self.waiting = gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).")
        self.prefix_queries = counter("prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("num_preemptions", "Requests preempted by the scheduler.")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens prefilled.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between output chunks.",
                             ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Request latency, arrival to finish.",
                             E2E_BUCKETS)
        self.queue_time = histogram("request_queue_time_seconds",
                                    "Time a request waited in the engine before it was first "
                                    "scheduled.", E2E_BUCKETS)
        self.prefill_time = histogram("request_prefill_time_seconds",
                                      "Time from a request's first scheduling to its first "
                                      "token, in the engine.", E2E_BUCKETS)
        self.spec_drafts = counter("spec_decode_num_drafts",
                                   "Speculative decoding: verified steps of drafting requests.")
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens",
                                         "Speculative decoding: draft tokens proposed.")
        self.spec_accepted = counter("spec_decode_num_accepted_tokens",
                                     "Speculative decoding: draft tokens accepted.")
        self._spec_per_pos = Counter("loom:spec_decode_num_accepted_tokens_per_pos",
                                     "Speculative decoding: draft tokens accepted, by position "
                                     "in the draft.", ["model_name", "position"],
                                     registry=self.registry)
        self._success = Counter("loom:request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=self.registry)
        self._lora_info = Gauge("loom:lora_requests_info", "LoRA: the adapters of running and "
                                "of waiting requests (comma-separated names); the value is "
                                "when they were last reported.",
                                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                                registry=self.registry, multiprocess_mode="mostrecent")
        self._label = model_name

    # -- StatsSink --------------------------------------------------------------------------

    def on_scheduler_stats(self, stats: SchedulerStats) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        self.prefix_queries.inc(stats.prefix_cache_queries)
        self.prefix_hits.inc(stats.prefix_cache_hits)
        self.preemptions.inc(stats.num_preemptions)
        self.prompt_tokens.inc(stats.num_prompt_tokens)
        self.generation_tokens.inc(stats.num_generation_tokens)
        if stats.spec_num_drafts:
            self.spec_drafts.inc(stats.spec_num_drafts)
            self.spec_draft_tokens.inc(stats.spec_num_draft_tokens)
            self.spec_accepted.inc(stats.spec_num_accepted_tokens)
            for position, n in enumerate(stats.spec_accepted_per_pos):
                self._spec_per_pos.labels(model_name=self._label, position=str(position)).inc(n)
        if stats.max_loras:
            self._lora_info.labels(max_lora=str(stats.max_loras),
                                   waiting_lora_adapters=",".join(stats.waiting_lora_adapters),
                                   running_lora_adapters=",".join(stats.running_lora_adapters)
                                   ).set_to_current_time()

    def on_first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def on_inter_token(self, seconds: float) -> None:
        self.itl.observe(seconds)

    def on_queued(self, seconds: float) -> None:
        self.queue_time.observe(seconds)

    def on_prefill(self, seconds: float) -> None:
        self.prefill_time.observe(seconds)

    def on_finished(self, e2e_seconds: float, finish_reason: str) -> None:
        self.e2e.observe(e2e_seconds)
        self._success.labels(model_name=self._label, finished_reason=finish_reason).inc()

    # -- exposition -------------------------------------------------------------------------

    def render(self) -> tuple[bytes, str]:
        registry = self.registry
        if multiprocess_dir() is not None:
            from prometheus_client import multiprocess
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
