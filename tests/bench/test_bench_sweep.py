"""`loom bench sweep` starts and stops real `loom serve` processes, and stops them whatever
happens."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from loom.bench.server_process import stop
from loom.cli import main


def test_sweep_runs_both_frontend_modes(tiny_llama_with_tokenizer, tmp_path, capsys):
    path, _ = tiny_llama_with_tokenizer
    code = main(["bench", "sweep", "--model", path, "--rates", "8,inf", "--duration", "1",
                 "--inf-num-prompts", "3",
                 "--random-input-len", "16", "--random-output-len", "4", "--ignore-eos",
                 "--result-dir", str(tmp_path), "--", "--device", "cpu", "--max-model-len", "128",
                 "--disable-log-stats"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "multiprocess TTFT" in out and "inprocess TPOT" in out
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert summary["errors"] == {} and len(summary["runs"]) == 4
    assert "multiprocess at rate inf (3 prompts): output throughput" in out
    row = summary["table"][0]
    assert row["rate"] == 8 and row["multiprocess"]["failed"] == 0 and row["inprocess"]["failed"] == 0
    for mode in ("multiprocess", "inprocess"):
        run = json.loads((tmp_path / f"serve-{mode}-8qps.json").read_text())
        assert run["completed"] == 8 and run["total_output_tokens"] == 32
        assert run["sweep_mode"] == mode and run["token_count_source"] == "usage"
        burst = json.loads((tmp_path / f"serve-{mode}-infqps.json").read_text())
        assert burst["completed"] == 3 and burst["total_output_tokens"] == 12
        assert (tmp_path / f"server-{mode}.log").is_file()
    # Each rate's server-side TTFT, split by the server's own histograms, over that rate's
    # requests only (the burst's differ): the engine's parts lie within the API's TTFT.
    for r in summary["runs"]:
        ms = r["server_mean_ms"]
        assert 0 < ms["prefill"] and 0 <= ms["queue"] and ms["between"] >= 0, ms
        assert ms["ttft"] == pytest.approx(ms["queue"] + ms["prefill"] + ms["between"])
        assert ms["ttft"] <= r["mean_ttft_ms"]  # the client's adds HTTP and tokenization
    assert out.count("server side, mean ms: TTFT") == 4
    inproc_log = (tmp_path / "server-inprocess.log").read_text().splitlines()[0]
    assert "--disable-frontend-multiprocessing" in inproc_log


def test_a_server_that_cannot_start_is_reported(tiny_llama_with_tokenizer, tmp_path, capsys):
    path, _ = tiny_llama_with_tokenizer
    start = time.monotonic()
    code = main(["bench", "sweep", "--model", path, "--rates", "2", "--duration", "1",
                 "--modes", "multiprocess", "--result-dir", str(tmp_path), "--",
                 "--device", "cpu", "--block-size", "12"])
    assert code == 1 and time.monotonic() - start < 60
    assert "exited with" in capsys.readouterr().err
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert "block_size" in summary["errors"]["multiprocess"]


def test_stop_kills_a_process_that_ignores_sigint():
    code = ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout.readline().strip() == b"up"
    start = time.monotonic()
    stop(proc, timeout_s=0.5)
    assert proc.returncode is not None and time.monotonic() - start < 5


def test_server_tp_is_read_from_the_engine_flags():
    from loom.bench.sweep import _server_tp
    assert _server_tp(("--load-format", "dummy")) == 1
    assert _server_tp(("-tp", "2")) == 2
    assert _server_tp(("--tensor-parallel-size=4",)) == 4


def test_server_latency_means_come_from_the_metrics_text():
    """Parsed from what prometheus_client renders for ServerMetrics: the means of what was
    observed between two readings, not since the server started."""
    from loom.bench import server_latency
    from loom.entrypoints.openai.metrics import ServerMetrics
    metrics = ServerMetrics("m")
    metrics.on_first_token(0.5)
    metrics.on_queued(0.1)
    metrics.on_prefill(0.2)
    before = server_latency.parse_totals(metrics.render()[0].decode())
    for ttft, queue, prefill in ((0.050, 0.010, 0.030), (0.070, 0.002, 0.040)):
        metrics.on_first_token(ttft)
        metrics.on_queued(queue)
        metrics.on_prefill(prefill)
    after = server_latency.parse_totals(metrics.render()[0].decode())
    means = server_latency.mean_ms(before, after)
    assert means == pytest.approx({"ttft": 60.0, "queue": 6.0, "prefill": 35.0, "between": 19.0})
    assert server_latency.mean_ms(after, after) is None  # nothing new observed
    assert server_latency.parse_totals("# no histograms\n") is None



def test_a_server_without_prometheus_metrics_gives_no_split(monkeypatch):
    import io
    import urllib.request

    from loom.bench import server_latency
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda url, timeout: io.BytesIO(b"<html>not metrics</html>\n"))
    assert server_latency.read_totals("http://server") is None
    assert server_latency.read_totals("http://127.0.0.1:9") is None  # nothing listens
