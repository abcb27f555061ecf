"""`loom chat` and `loom complete` (vLLM's clients): what they send, checked on a recording
server (the official openai client's requests), and against a real `loom serve`."""

from __future__ import annotations

import http.server
import io
import json
import logging
import threading
import time

import pytest

from loom.cli import main
from tests.entrypoints.conftest import API_KEY


class _Recorder(http.server.BaseHTTPRequestHandler):
    """An OpenAI server that lists one model and streams "reply N" for the Nth request."""
    bodies: list[dict] = []

    def do_GET(self):
        self._json({"object": "list", "data": [
            {"id": "fake-model", "object": "model", "created": 0, "owned_by": "test"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.bodies.append(body)
        if body["model"] == "nope":  # as loom serve answers a model it does not serve
            return self._json({"error": {"message": "The model `nope` does not exist.",
                                         "type": "NotFoundError", "code": 404}}, 404)
        n = len(self.bodies)
        chat = self.path.endswith("/chat/completions")
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in ("reply ", str(n)):
            choice = ({"index": 0, "delta": {"content": piece}, "finish_reason": None} if chat
                      else {"index": 0, "text": piece, "finish_reason": None})
            chunk = {"id": "x", "created": 0, "model": body["model"], "choices": [choice],
                     "object": "chat.completion.chunk" if chat else "text_completion"}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def _json(self, obj, status=200):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def recorder():
    _Recorder.bodies = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def test_chat_keeps_the_conversation_and_streams_replies(recorder, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nagain\n"))
    assert main(["chat", "--url", recorder, "--system-prompt", "Be brief"]) == 0
    first, second = _Recorder.bodies
    system = {"role": "system", "content": "Be brief"}
    assert first["model"] == "fake-model" and first["stream"] is True
    assert first["messages"] == [system, {"role": "user", "content": "hello"}]
    assert second["messages"] == [system, {"role": "user", "content": "hello"},
                                  {"role": "assistant", "content": "reply 1"},
                                  {"role": "user", "content": "again"}]
    out = capsys.readouterr().out
    assert "reply 1\n" in out and "reply 2\n" in out


def test_complete_quick_sends_one_prompt(recorder, capsys):
    assert main(["complete", "--url", recorder, "--model-name", "m", "--max-tokens", "5",
                 "-q", "Once"]) == 0
    (body,) = _Recorder.bodies
    assert (body["model"], body["prompt"], body["max_tokens"]) == ("m", "Once", 5)
    assert capsys.readouterr().out == "reply 1\n"


def test_against_loom_serve(parsing_server, capsys):
    url = f"{parsing_server.url}/v1"
    assert main(["complete", "--url", url, "--api-key", API_KEY, "--max-tokens", "4",
                 "-q", "Once upon a time"]) == 0
    assert capsys.readouterr().out.strip()
    # The server's refusal, one line; then a bad key and no server at all.
    assert main(["complete", "--url", url, "--api-key", API_KEY, "--max-tokens", "100000",
                 "-q", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"loom complete: error: server: {url} answered HTTP 400: ")
    assert "maximum context length" in err and err.count("\n") == 1
    assert main(["chat", "--url", url, "--api-key", "wrong", "-q", "Hi"]) == 2
    assert capsys.readouterr().err.startswith(
        f"loom chat: error: api_key: the server at {url} refused it (HTTP 401): ")
    assert main(["chat", "--url", url, "--api-key", API_KEY, "--model-name", "nope",
                 "-q", "Hi"]) == 2
    assert capsys.readouterr().err == (
        f"loom chat: error: model_name: the server at {url} does not serve it "
        "(The model `nope` does not exist.), got 'nope'\n")
    assert main(["chat", "--url", "http://127.0.0.1:9/v1", "-q", "Hi"]) == 2
    assert capsys.readouterr().err == (
        "loom chat: error: url: cannot reach http://127.0.0.1:9/v1: Connection error.\n")


@pytest.fixture
def client_loggers():
    """The client loggers' levels put back after the test (the commands set them)."""
    loggers = [logging.getLogger(name) for name in ("httpx", "openai")]
    levels = [logger.level for logger in loggers]
    yield
    for logger, level in zip(loggers, levels):
        logger.setLevel(level)


@pytest.mark.parametrize("command", ["chat", "complete"])
@pytest.mark.parametrize("model", [[], ["--model-name", "x"]])
def test_no_server_is_one_line_with_or_without_a_model_name(command, model, capsys, caplog,
                                                             client_loggers):
    caplog.set_level(logging.INFO)
    assert main([command, "--url", "http://127.0.0.1:9/v1", *model, "-q", "Hi"]) == 2
    assert capsys.readouterr().err == (f"loom {command}: error: url: cannot reach "
                                       "http://127.0.0.1:9/v1: Connection error.\n")
    # No "HTTP Request: ..." or "Retrying request ..." lines from the client libraries.
    assert [r.name for r in caplog.records if r.name.startswith(("httpx", "openai"))] == []


@pytest.mark.parametrize("url", ["127.0.0.1:9/v1", "localhost:8000", "notaurl", "http://",
                                 "http://127.0.0.1:x/v1"])
def test_a_url_that_is_not_http_is_refused_at_once(url, capsys, client_loggers):
    start = time.monotonic()
    assert main(["complete", "--url", url, "--model-name", "x", "-q", "Hi"]) == 2
    assert time.monotonic() - start < 0.5  # no request, no retries
    assert capsys.readouterr().err == ("loom complete: error: url: must be an http(s) URL such "
                                       f"as http://localhost:8000/v1, got {url!r}\n")


@pytest.mark.parametrize("command", ["chat", "complete"])
def test_an_unknown_model_name_is_the_commands_error(command, recorder, capsys,
                                                     client_loggers):
    assert main([command, "--url", recorder, "--model-name", "nope", "-q", "Hi"]) == 2
    assert capsys.readouterr().err == (
        f"loom {command}: error: model_name: the server at {recorder} does not serve it "
        "(The model `nope` does not exist.), got 'nope'\n")


def test_an_interactive_session_goes_on_after_a_refused_request(recorder, monkeypatch, capsys,
                                                                client_loggers):
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nagain\n"))
    assert main(["chat", "--url", recorder, "--model-name", "nope"]) == 0
    assert len(_Recorder.bodies) == 2
    err = capsys.readouterr().err
    assert err.count("error: model_name: the server at") == 2 and "loom chat:" not in err
