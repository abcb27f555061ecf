"""`loom bench` mistakes found before any work: each one line `loom bench <sub>: error: ...`
(exit 2), with no model loaded, no request sent and no child run started."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time

import pytest

from loom.bench import async_tp, throughput
from loom.cli import main


def _never(*args, **kwargs):
    raise AssertionError("the benchmark started")


def _error(capsys, *argv: str) -> str:
    start = time.monotonic()
    assert main(["bench", *argv]) == 2
    assert time.monotonic() - start < 5  # refused up front, not after loading anything
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


# async-tp


@pytest.fixture
def gpus(monkeypatch):
    """Call with how many CUDA GPUs torch should see; no child run may start."""
    import torch
    monkeypatch.setattr(async_tp, "_run_one", _never)

    def see(count: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    return see


def test_async_tp_without_cuda_is_refused_at_once(gpus, capsys, tmp_path):
    gpus(0)
    err = _error(capsys, "async-tp", "--model", "llama-3.2-1b", "--result-dir",
                 str(tmp_path / "out"))
    assert err.startswith("loom bench async-tp: error: async-tp: needs CUDA GPUs"), err
    assert not (tmp_path / "out").exists()


def test_async_tp_with_fewer_gpus_than_tp_is_refused_at_once(gpus, capsys, tmp_path):
    gpus(2)
    err = _error(capsys, "async-tp", "--model", "llama-3.2-1b", "-tp", "4", "--result-dir",
                 str(tmp_path / "out"), "--", "--device", "cuda")
    assert err == ("loom bench async-tp: error: tensor_parallel_size: needs as many CUDA GPUs, "
                   "torch sees 2, got 4\n")


def test_async_tp_exits_nonzero_when_every_run_failed(monkeypatch, capsys, tmp_path):
    """On the CPU (`--device cpu`, as test_bench_async_tp runs it) no GPU is asked for."""
    def failed(args, engine, out_dir, n, graph, v, repeat):
        return {"run": f"{graph}{n}-{v.name}-r{repeat}", "error": "exit 1: boom"}
    monkeypatch.setattr(async_tp, "_run_one", failed)
    argv = ["bench", "async-tp", "--model", "x", "--input-lens", "16", "--graphs", "static",
            "--impls", "overlap", "--repeats", "1", "--result-dir", str(tmp_path),
            "--", "--device", "cpu"]
    monkeypatch.setattr(sys, "argv", ["loom", *argv])
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.err == (f"loom bench async-tp: all 2 runs failed; their logs are in "
                            f"{tmp_path}\n")
    assert "failed" in captured.out  # the table is still printed, and written
    (row,) = json.loads((tmp_path / "table.json").read_text())["rows"]
    assert row["cells"]["off"]["mean_s"] is None


# serve


@pytest.mark.parametrize("url", ["127.0.0.1:9", "notaurl", "localhost:8000/v1", "http://",
                                 "ftp://127.0.0.1:9"])
def test_serve_refuses_a_base_url_that_is_not_http(url, capsys):
    err = _error(capsys, "serve", "--base-url", url, "--num-prompts", "2")
    assert err == ("loom bench serve: error: base_url: must be an http(s) URL such as "
                   f"http://127.0.0.1:8000, got {url!r}\n")


def test_serve_turns_a_non_http_answer_into_one_line(capsys):
    """A client error that is not a refused connection ends the wait at once."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    threading.Thread(target=answer, daemon=True).start()
    base = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        err = _error(capsys, "serve", "--base-url", base, "--num-prompts", "2",
                     "--tokenizer", "unused")
    finally:
        listener.close()
    assert err.startswith(f"loom bench serve: error: server: GET {base}/v1/models failed: "
                          "ClientResponseError: 400"), err


# throughput


@pytest.mark.parametrize("flag, field", [("--output-len", "output_len"),
                                         ("--input-len", "input_len"),
                                         ("--num-prompts", "num_prompts")])
def test_throughput_checks_lengths_before_loading_the_model(flag, field, capsys, monkeypatch):
    monkeypatch.setattr(throughput, "setup_offline", _never)
    err = _error(capsys, "throughput", flag, "0")
    assert err == f"loom bench throughput: error: {field}: must be at least 1, got 0\n"
