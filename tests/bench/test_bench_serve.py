"""`loom bench serve` against a fake streaming server: counts add up, metrics are right."""

from __future__ import annotations

import json
import re
import sys

import numpy as np
import pytest

from loom.bench.client import RequestOutcome
from loom.bench.metrics import compute_metrics
from loom.cli import main


def _serve(base_url: str, tokenizer: str, tmp_path, *extra: str) -> int:
    return main(["bench", "serve", "--base-url", base_url, "--tokenizer", tokenizer,
                 "--dataset-name", "random", "--random-input-len", "24", "--random-output-len", "6",
                 "--num-prompts", "12", "--request-rate", "200", "--seed", "1",
                 "--result-dir", str(tmp_path), "--result-filename", "run.json", *extra])


def _block(text: str) -> dict[str, float]:
    rows = re.findall(r"^([A-Za-z0-9 ()/.\-]+):\s+([0-9.]+)\s*$", text, flags=re.M)
    return {label.strip(): float(value) for label, value in rows}


def test_counts_add_up_against_the_server_usage(fake_server, llama3_tokenizer_dir, tmp_path, capsys):
    server = fake_server(tokens_per_chunk=2)
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--ignore-eos",
                  "--save-result", "--plot") == 0
    out = capsys.readouterr().out
    block = _block(out)
    assert "Serving Benchmark Result" in out
    assert block["Successful requests"] == 12 and block["Failed requests"] == 0
    # The first payload is the untimed probe; the other 12 are the benchmark's.
    assert block["Total generated tokens"] == sum(server.state.reported_completion_tokens[1:]) == 72
    assert block["Total input tokens"] == sum(server.state.reported_prompt_tokens[1:])
    for metric in ("TTFT", "TPOT", "ITL", "E2EL"):
        assert {f"Mean {metric} (ms)", f"Median {metric} (ms)", f"P99 {metric} (ms)"} <= set(block)
    body = server.state.payloads[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["min_tokens"] == body["max_tokens"] == 6
    assert body["model"] == "fake-model"  # taken from /v1/models

    result = json.loads((tmp_path / "run.json").read_text())
    assert result["completed"] == 12 and result["token_count_source"] == "usage"
    assert result["server_info"]["device"] == "test-device"
    assert len(result["requests"]) == 12 and result["request_rate"] == "200"
    assert {"date", "command", "git_commit", "stats", "dataset", "total_output_tokens"} <= set(result)
    assert set(result["stats"]) == {"ttft", "tpot", "itl", "e2el"}
    assert (tmp_path / "run.png").stat().st_size > 1000


def test_chat_endpoint_and_missing_usage_count_chunks(fake_server, llama3_tokenizer_dir, tmp_path, capsys):
    server = fake_server(send_usage=False)
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--endpoint",
                  "/v1/chat/completions", "--model", "fake-model", "--save-result") == 0
    out = capsys.readouterr().out
    assert "counted from stream chunks" in out
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["token_count_source"] == "chunks" and result["total_output_tokens"] == 72
    assert "messages" in server.state.payloads[-1] and "ignore_eos" not in server.state.payloads[-1]
    # The role-only opening chunk is not a token: 6 events, 5 gaps per request.
    assert all(len(r["itl_s"]) == 5 for r in result["requests"])


def test_embeddings_endpoint_counts_inputs_and_times_whole_answers(
        fake_server, llama3_tokenizer_dir, tmp_path, capsys):
    """--endpoint /v1/embeddings: each prompt sent as an embedding input (no streaming, no
    generation settings), input tokens from usage, E2EL alone timed, failures counted."""
    server = fake_server(fail_every=5)  # the probe is request 1; requests 5 and 10 fail
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--endpoint",
                  "/v1/embeddings", "--save-result") == 0
    out = capsys.readouterr().out
    block = _block(out)
    assert block["Successful requests"] == 10 and block["Failed requests"] == 2
    assert block["Total generated tokens"] == 0 and block["Output token throughput (tok/s)"] == 0
    answered = [n for i, n in enumerate(server.state.reported_prompt_tokens) if i > 0]
    assert block["Total input tokens"] == sum(answered)
    assert "Mean E2EL (ms)" in block and "Mean TTFT (ms)" not in block
    assert "Mean TPOT (ms)" not in block and "Note:" not in out
    assert all(set(body) == {"model", "input"} for body in server.state.payloads)
    result = json.loads((tmp_path / "run.json").read_text())
    ok = [r for r in result["requests"] if r["success"]]
    assert all(r["ttft_s"] == r["e2el_s"] > 0 and r["output_tokens"] == 0 for r in ok)
    assert result["endpoint"] == "/v1/embeddings"


def test_vllm_backend_names_pick_the_endpoint(fake_server, llama3_tokenizer_dir, tmp_path,
                                              capsys):
    """vLLM's --backend names: openai-chat posts chat completions, openai-embeddings
    embeddings; a --backend and an --endpoint that disagree are refused before any
    request."""
    server = fake_server()
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--backend",
                  "openai-chat") == 0
    assert "messages" in server.state.payloads[-1]
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--backend",
                  "openai-embeddings", "--endpoint", "/v1/embeddings") == 0
    assert set(server.state.payloads[-1]) == {"model", "input"}
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--backend", "vllm") == 0
    assert "prompt" in server.state.payloads[-1]
    sent = len(server.state.payloads)
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--backend", "openai-chat",
                  "--endpoint", "/v1/completions") == 2
    assert "openai-chat posts to /v1/chat/completions" in capsys.readouterr().err
    assert len(server.state.payloads) == sent


def test_embeddings_refuse_token_timings(fake_server, llama3_tokenizer_dir, tmp_path, capsys):
    server = fake_server()
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--endpoint",
                  "/v1/embeddings", "--percentile-metrics", "tpot,e2el") == 2
    assert "e2el alone applies" in capsys.readouterr().err
    assert not server.state.payloads  # refused before any request


def test_sampling_fields_goodput_and_metadata(fake_server, llama3_tokenizer_dir, tmp_path,
                                             capsys):
    """vLLM's --temperature/--top-p/--top-k/--min-p go into every request; --goodput counts
    the requests meeting every objective (all of them under a loose one, none under an
    impossible one); --metadata lands in the result JSON."""
    server = fake_server()
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--temperature", "0.7",
                  "--top-p", "0.9", "--top-k", "20", "--min-p", "0.05", "--goodput",
                  "e2el:60000", "ttft:60000", "--metadata", "gpu=h200", "note = a b",
                  "--save-result") == 0
    block = _block(capsys.readouterr().out)
    body = server.state.payloads[-1]
    assert (body["temperature"], body["top_p"], body["top_k"], body["min_p"]) == (
        0.7, 0.9, 20, 0.05)
    assert block["Request goodput (req/s)"] == pytest.approx(
        block["Request throughput (req/s)"], rel=1e-2)
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["metadata"] == {"gpu": "h200", "note": "a b"}
    assert result["goodput_ms"] == {"e2el": 60000.0, "ttft": 60000.0}
    assert result["request_goodput"] == pytest.approx(result["request_throughput"])
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--goodput",
                  "tpot:0.000001") == 0
    assert _block(capsys.readouterr().out)["Request goodput (req/s)"] == 0
    assert "temperature" in server.state.payloads[-1] and "top_p" not in server.state.payloads[-1]


@pytest.mark.parametrize("args, message", [
    (["--goodput", "ttft"], "goodput: 'ttft' is not NAME:MILLISECONDS"),
    (["--goodput", "itl:5"], "goodput: 'itl:5'"),
    (["--goodput", "ttft:-1"], "goodput: 'ttft:-1'"),
    (["--top-p", "0"], "top_p: 0.0 is out of range"),
    (["--top-k", "0"], "top_k: 0 is out of range"),
    (["--metadata", "novalue"], "metadata: 'novalue' is not KEY=VALUE"),
    (["--endpoint", "/v1/embeddings", "--goodput", "ttft:5"], "e2el alone applies"),
])
def test_bad_request_options_are_refused(fake_server, llama3_tokenizer_dir, tmp_path, capsys,
                                         args, message):
    server = fake_server()
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, *args) == 2
    assert message in capsys.readouterr().err
    assert not server.state.payloads


def test_goodput_counts_against_known_outcomes():
    """Each objective in milliseconds against the request's own TTFT, TPOT and E2EL; a
    one-token output's TPOT counts as 0."""
    outcomes = [_outcome(0.1, 1.0, 11, [0.09] * 10),   # tpot 0.09 s
                _outcome(0.3, 0.5, 5, [0.05] * 4),     # tpot 0.05 s
                _outcome(0.2, 0.2, 1, [])]             # one token
    m = compute_metrics(outcomes, 2.0, [50.0], {"ttft": 250.0, "tpot": 60.0})
    assert m.request_goodput == pytest.approx(1 / 2.0)  # only the third
    m = compute_metrics(outcomes, 2.0, [50.0], {"e2el": 600.0})
    assert m.request_goodput == pytest.approx(2 / 2.0)
    assert compute_metrics(outcomes, 2.0, [50.0]).request_goodput is None


def test_waits_for_a_server_still_starting(fake_server, llama3_tokenizer_dir, tmp_path,
                                          capsys):
    """--ready-check-timeout-sec: refused connections are retried until the server comes
    up (here 1.5 s late), and past the timeout the run ends with a named error."""
    import socket
    import threading
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    assert _serve(url, llama3_tokenizer_dir, tmp_path, "--ready-check-timeout-sec", "0.5") == 2
    assert "accepted no connection within 0.5 s" in capsys.readouterr().err
    late = threading.Timer(1.5, lambda: fake_server(port=port))
    late.start()
    try:
        assert _serve(url, llama3_tokenizer_dir, tmp_path, "--ready-check-timeout-sec",
                      "30") == 0
    finally:
        late.join()
    out = capsys.readouterr().out
    assert f"Waiting up to 30 s for {url}" in out and _block(out)["Successful requests"] == 12


def test_failed_requests_are_counted_not_raised(fake_server, llama3_tokenizer_dir, tmp_path, capsys):
    server = fake_server(fail_every=4)  # the probe is request 1; requests 4, 8, 12 of 13 fail
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--max-concurrency", "3",
                  "--save-result") == 0
    block = _block(capsys.readouterr().out)
    assert block["Successful requests"] == 9 and block["Failed requests"] == 3
    result = json.loads((tmp_path / "run.json").read_text())
    errors = [r["error"] for r in result["requests"] if not r["success"]]
    assert len(errors) == 3 and all("HTTP 500" in e for e in errors)


def _outcome(ttft: float, latency: float, tokens: int, itl: list[float]) -> RequestOutcome:
    return RequestOutcome(prompt_len=10, success=True, ttft=ttft, latency=latency, itl=itl,
                          event_times=[ttft] * tokens, output_tokens=tokens, tokens_from_usage=True)


def test_percentiles_match_numpy_on_known_inputs():
    rng = np.random.default_rng(0)
    outcomes = [_outcome(float(t), float(t) + 1.0, int(n), list(rng.random(3)))
                for t, n in zip(rng.random(50), rng.integers(2, 20, 50))]
    outcomes.append(RequestOutcome(prompt_len=10, error="boom"))
    m = compute_metrics(outcomes, duration_s=10.0, points=(50, 90, 99, 99.9))
    ok = outcomes[:-1]
    ttft = np.array([o.ttft for o in ok]) * 1e3
    tpot = np.array([(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok]) * 1e3
    itl = np.array([g for o in ok for g in o.itl]) * 1e3
    assert m.completed == 50 and m.failed == 1
    assert m.total_output_tokens == sum(o.output_tokens for o in ok)
    assert m.output_throughput == pytest.approx(m.total_output_tokens / 10.0)
    for name, ref in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        s = m.stats[name]
        assert s.mean_ms == pytest.approx(ref.mean()) and s.median_ms == pytest.approx(np.median(ref))
        for p in (50, 90, 99, 99.9):
            key = str(int(p)) if float(p).is_integer() else str(p)
            assert s.percentiles_ms[key] == pytest.approx(np.percentile(ref, p))
    assert m.stats["e2el"].mean_ms == pytest.approx(np.mean([o.latency for o in ok]) * 1e3)


def test_tpot_excludes_the_first_token():
    o = _outcome(ttft=0.5, latency=1.4, tokens=10, itl=[0.1] * 9)
    assert o.tpot == pytest.approx(0.1)
    assert _outcome(0.5, 0.5, 1, []).tpot is None


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch):
    from loom.bench.plot import check_plotting
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    with pytest.raises(ValueError, match="needs matplotlib.*pip install"):
        check_plotting()


def test_compute_floor_uses_the_shipped_shapes(fake_server, tmp_path, monkeypatch, capsys,
                                               llama3_tokenizer_dir):
    from loom.bench import serve
    from loom.bench.floors import throughput_floor_s
    from loom.bench.report import model_arch
    # TFLOP/s and the GPU's name, as if measured on CUDA
    monkeypatch.setattr(serve, "_floor_rate", lambda: (500.0, "Test GPU"))
    server = fake_server()
    assert main(["bench", "serve", "--base-url", server.base_url, "--model", "llama-3.1-8b",
                 "--random-input-len", "16", "--random-output-len", "4", "--num-prompts", "4",
                 "--compute-floor", "-tp", "2", "--save-result", "--result-dir", str(tmp_path),
                 "--result-filename", "floor.json"]) == 0
    assert "Compute floor:" in capsys.readouterr().out
    r = json.loads((tmp_path / "floor.json").read_text())
    assert r["tokenizer"] == llama3_tokenizer_dir  # picked for the shipped Llama config
    floor = throughput_floor_s(model_arch("llama-3.1-8b"),
                               r["total_input_tokens"] + r["total_output_tokens"], 500.0, 2)
    assert r["compute_floor"]["floor_s"] == pytest.approx(floor)
    assert r["compute_floor"]["duration_ratio_to_floor"] == pytest.approx(r["duration_s"] / floor)
    assert r["compute_floor"]["device"] == "Test GPU"


def test_a_refused_model_list_reports_the_http_status(fake_server, llama3_tokenizer_dir, tmp_path,
                                                      capsys):
    server = fake_server(models_status=401)
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path) == 2
    err = capsys.readouterr().err
    assert f"{server.base_url}/v1/models answered HTTP 401: " in err and "API key" in err
    assert "lists none" not in err and err.count("\n") == 1


def test_lora_modules_spread_requests_over_the_adapters(fake_server, llama3_tokenizer_dir,
                                                       tmp_path, capsys):
    server = fake_server(tokens_per_chunk=2)
    assert _serve(server.base_url, llama3_tokenizer_dir, tmp_path, "--ignore-eos",
                  "--lora-modules", "sql", "chat") == 0
    models = [body["model"] for body in server.state.payloads[1:]]  # after the probe
    assert len(models) == 12 and set(models) == {"sql", "chat"}


def test_a_tokenizer_hub_id_is_read_from_the_cache(fake_server, llama3_tokenizer_dir, tmp_path,
                                                   capsys, monkeypatch):
    from huggingface_hub import constants

    from pathlib import Path

    from tests.models.test_hub_names import SHA_MAIN, _add_snapshot
    _add_snapshot(tmp_path / "cache", "org/tok", SHA_MAIN, Path(llama3_tokenizer_dir), ("main",))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    server = fake_server()
    assert _serve(server.base_url, "org/tok", tmp_path) == 0
    assert _block(capsys.readouterr().out)["Successful requests"] == 12
    assert _serve(server.base_url, "org/none", tmp_path) == 2
    assert ("loom bench serve: error: tokenizer: 'org/none' is not a local path, and the "
            "Hugging Face cache") in capsys.readouterr().err
