"""`--otlp-traces-endpoint`: a real server exports one `llm_request` span per request over
OTLP/HTTP to a collector stub, parented to the caller's W3C traceparent."""

from __future__ import annotations

import argparse
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loom import tracing
from loom.entrypoints.openai import cli as serve_cli
from tests.entrypoints.conftest import start_server

trace_pb2 = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="pip install 'loom[tracing]'")

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Collector:
    """POST /v1/traces -> decoded ExportTraceServiceRequest, kept in order."""

    def __init__(self) -> None:
        self.requests: list = []
        self.received = threading.Condition()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                ok = self.path == "/v1/traces"
                if ok:
                    message = trace_pb2.ExportTraceServiceRequest()
                    message.ParseFromString(body)
                    with collector.received:
                        collector.requests.append(message)
                        collector.received.notify_all()
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_port}/v1/traces"

    def spans(self) -> list:
        return [span for request in self.requests for rs in request.resource_spans
                for ss in rs.scope_spans for span in ss.spans]

    def wait_for_spans(self, count: int, timeout: float = 30) -> list:
        with self.received:
            self.received.wait_for(lambda: len(self.spans()) >= count, timeout)
        return self.spans()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


def _attributes(span) -> dict:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


@pytest.fixture(scope="module")
def traced(tiny_chat_model, tmp_path_factory):
    collector = Collector()
    # The endpoint from the environment, as vLLM also reads it; export batches quickly.
    server = start_server(tiny_chat_model, "mp", tmp_path_factory.mktemp("trace-logs"),
                          extra_env={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": collector.url,
                                     "OTEL_BSP_SCHEDULE_DELAY": "50"})
    yield server, collector
    server.stop()
    collector.close()


def test_request_span_has_parent_and_attributes(traced):
    server, collector = traced
    client = server.client()
    traceparent = f"00-{TRACE_ID}-{PARENT_ID}-01"
    resp = client.completions.create(model=client.models.list().data[0].id, prompt="Hello there",
                                     max_tokens=5, temperature=0.0, top_p=0.9,
                                     extra_body={"ignore_eos": True},
                                     extra_headers={"traceparent": traceparent})
    client.chat.completions.create(model=resp.model, max_tokens=3,
                                   messages=[{"role": "user", "content": "hi"}])
    spans = collector.wait_for_spans(2)
    assert len(spans) == 2
    completion = next(s for s in spans if s.trace_id.hex() == TRACE_ID)
    assert completion.name == "llm_request" and completion.parent_span_id.hex() == PARENT_ID
    attrs = _attributes(completion)
    assert attrs["gen_ai.request.id"] == f"{resp.id}-0"
    assert attrs["gen_ai.response.model"] == resp.model
    assert attrs["gen_ai.request.max_tokens"] == 5 and attrs["gen_ai.request.n"] == 1
    assert attrs["gen_ai.request.temperature"] == 0.0
    assert attrs["gen_ai.request.top_p"] == pytest.approx(0.9)
    assert attrs["gen_ai.usage.prompt_tokens"] == resp.usage.prompt_tokens
    assert attrs["gen_ai.usage.completion_tokens"] == resp.usage.completion_tokens == 5
    assert 0 < attrs["gen_ai.latency.time_to_first_token"] <= attrs["gen_ai.latency.e2e"]
    assert 0 <= attrs["gen_ai.latency.time_in_queue"] < attrs["gen_ai.latency.time_to_first_token"]
    # The engine's queue and prefill both lie within the API's time to the first token.
    assert 0 < attrs["gen_ai.latency.time_in_model_prefill"] <= (
        attrs["gen_ai.latency.time_to_first_token"] - attrs["gen_ai.latency.time_in_queue"])
    assert completion.end_time_unix_nano > completion.start_time_unix_nano
    chat = next(s for s in spans if s is not completion)  # no traceparent: a root span
    assert chat.trace_id.hex() != TRACE_ID and not chat.parent_span_id


def test_missing_opentelemetry_is_a_clear_cli_error(monkeypatch):
    monkeypatch.setattr(tracing, "_OTEL_IMPORT_ERROR", ImportError("No module named 'x'"))
    args = argparse.Namespace(otlp_traces_endpoint="http://127.0.0.1:4318/v1/traces")
    with pytest.raises(ValueError, match=r"pip install 'loom\[tracing\]'"):
        serve_cli._traces_endpoint(args)


def test_traces_url():
    assert tracing.traces_url("http://h:4318") == "http://h:4318/v1/traces"
    assert tracing.traces_url("http://h:4318/v1/traces") == "http://h:4318/v1/traces"
    with pytest.raises(ValueError, match="otlp_traces_endpoint"):
        tracing.traces_url("grpc://h:4317")
