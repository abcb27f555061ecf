"""`loom bench sweep` starts and stops real `loom serve` processes, and stops them whatever
happens."""

from __future__ import annotations

import json
import subprocess
import sys
import time

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
