"""OpenTelemetry request tracing, as vLLM's `--otlp-traces-endpoint`.

Each generate request of the API server ends as one `llm_request` span carrying vLLM's
`gen_ai.*` attributes, parented to the caller's W3C `traceparent` header and exported over
OTLP/HTTP (protobuf). OpenTelemetry is an optional dependency (`pip install loom[tracing]`);
this module imports without it, and nothing here runs unless the flag is given.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from urllib.parse import urlsplit

from loom.outputs import RequestOutput
from loom.sampling_params import SamplingParams

try:
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    _OTEL_IMPORT_ERROR: ImportError | None = None
except ImportError as e:
    _OTEL_IMPORT_ERROR = e

INSTALL_HINT = ("pip install 'loom[tracing]' (or: pip install opentelemetry-api "
                "opentelemetry-sdk opentelemetry-exporter-otlp-proto-http)")
TRACE_HEADERS = ("traceparent", "tracestate")
SPAN_NAME = "llm_request"


class SpanAttributes:
    """vLLM's attribute names (OpenTelemetry's gen_ai semantic conventions)."""
    GEN_AI_REQUEST_ID = "gen_ai.request.id"
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
    GEN_AI_REQUEST_N = "gen_ai.request.n"
    GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    GEN_AI_USAGE_NUM_SEQUENCES = "gen_ai.usage.num_sequences"
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"


def otel_import_error() -> ImportError | None:
    return _OTEL_IMPORT_ERROR


def check_tracing_available() -> None:
    if _OTEL_IMPORT_ERROR is not None:
        raise ValueError(f"otlp_traces_endpoint: tracing needs OpenTelemetry, which is not "
                         f"installed ({_OTEL_IMPORT_ERROR}); {INSTALL_HINT}")


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL: a bare collector address gets the standard /v1/traces."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"otlp_traces_endpoint: must be an http(s) URL of an OTLP/HTTP "
                         f"collector (e.g. http://127.0.0.1:4318/v1/traces), got {endpoint!r}")
    return endpoint if parts.path.strip("/") else endpoint.rstrip("/") + "/v1/traces"


def extract_trace_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The W3C trace-context headers of an incoming request (HTTP header names are
    case-insensitive; Starlette's mapping already is)."""
    return {name: headers[name] for name in TRACE_HEADERS if name in headers}


class RequestTracer:
    """Owns the tracer provider of one API server process; makes one trace per request."""

    def __init__(self, endpoint: str, model: str, service_name: str = "loom") -> None:
        check_tracing_available()
        self.model = model
        self._provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self._provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint))))
        self._tracer = self._provider.get_tracer("loom.tracing")

    def begin(self, request_id: str, params: SamplingParams, num_prompt_tokens: int,
              trace_headers: Mapping[str, str] | None) -> RequestTrace:
        return RequestTrace(self, request_id, params, num_prompt_tokens, trace_headers or {})

    def export(self, trace_: RequestTrace, end_wall_ns: int) -> None:
        context = TraceContextTextMapPropagator().extract(trace_.headers)
        span = self._tracer.start_span(SPAN_NAME, context=context, kind=trace.SpanKind.SERVER,
                                       start_time=trace_.arrival_wall_ns)
        span.set_attributes(trace_.attributes(self.model))
        span.end(end_time=end_wall_ns)

    def shutdown(self) -> None:
        """Flush the spans still batched, then stop exporting."""
        self._provider.shutdown()


class RequestTrace:
    """What one request's span needs, gathered while it runs; exported when it ends."""

    def __init__(self, tracer: RequestTracer, request_id: str, params: SamplingParams,
                 num_prompt_tokens: int, headers: Mapping[str, str]) -> None:
        self.tracer, self.request_id, self.params = tracer, request_id, params
        self.num_prompt_tokens = num_prompt_tokens
        self.headers = dict(headers)
        self.arrival_wall_ns = time.time_ns()
        self.arrival = time.monotonic()
        self.first_token: float | None = None
        self.finished: float | None = None
        self.num_completion_tokens = 0
        self.queue_time: float | None = None
        """Seconds in the engine's queue, from the engine's first output."""
        self.prefill_time: float | None = None
        """Seconds from first scheduling to the first token, as the engine measured them."""

    def observe(self, output: RequestOutput, now: float) -> None:
        """Fold in one delta output, at monotonic time now."""
        new_tokens = sum(len(c.token_ids) for c in output.outputs)
        if new_tokens and self.first_token is None:
            self.first_token = now
        self.num_completion_tokens += new_tokens
        if output.finished:
            self.finished = now

    def end(self) -> None:
        """Export the span (a request that ends early, aborted or failed, still gets one)."""
        self.tracer.export(self, time.time_ns())

    def attributes(self, model: str) -> dict[str, str | int | float]:
        a = SpanAttributes
        attrs: dict[str, str | int | float] = {
            a.GEN_AI_REQUEST_ID: self.request_id, a.GEN_AI_RESPONSE_MODEL: model,
            a.GEN_AI_REQUEST_TEMPERATURE: self.params.temperature,
            a.GEN_AI_REQUEST_TOP_P: self.params.top_p, a.GEN_AI_REQUEST_N: self.params.n,
            a.GEN_AI_USAGE_NUM_SEQUENCES: self.params.n,
            a.GEN_AI_USAGE_PROMPT_TOKENS: self.num_prompt_tokens,
            a.GEN_AI_USAGE_COMPLETION_TOKENS: self.num_completion_tokens,
            a.GEN_AI_LATENCY_E2E: (self.finished or time.monotonic()) - self.arrival,
        }
        if self.params.max_tokens is not None:
            attrs[a.GEN_AI_REQUEST_MAX_TOKENS] = self.params.max_tokens
        if self.first_token is not None:
            attrs[a.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] = self.first_token - self.arrival
        if self.queue_time is not None:
            attrs[a.GEN_AI_LATENCY_TIME_IN_QUEUE] = self.queue_time
        if self.prefill_time is not None:
            attrs[a.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL] = self.prefill_time
        return attrs
