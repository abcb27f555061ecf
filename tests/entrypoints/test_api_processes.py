"""With --api-server-count > 1: an API server process that fails on a bad setting says so
in one line, and the supervisor reports its real exit code."""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import sys
from types import SimpleNamespace

import msgspec

from loom.engine.launcher import EngineEndpoint
from loom.engine.protocol import EngineReady
from loom.entrypoints.openai import launcher
from loom.entrypoints.openai.api_server import ServerOptions


def test_bad_setting_in_an_api_process_is_one_line(capfd):
    options = ServerOptions(model="m", served_model_names=["m"], tokenizer="/nonexistent/tok",
                            api_server_count=2)
    endpoint = EngineEndpoint("ipc:///nonexistent/in", "ipc:///nonexistent/out", os.getpid(),
                              EngineReady(256, 128, None, 16, 16))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        p = multiprocessing.get_context("spawn").Process(
            target=launcher.run_api_process,
            args=(msgspec.json.encode(options), msgspec.json.encode([endpoint]), 0, sock))
        p.start()
        p.join(60)
    assert p.exitcode == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err, err
    assert err.count("loom serve: error: tokenizer: /nonexistent/tok") == 1, err


def test_supervisor_reports_the_exit_code(caplog):
    """Read once the process is joined: its sentinel fires a moment before its exit code
    is known (the log said `codes [None]`)."""
    ctx = multiprocessing.get_context("spawn")
    engine_alive_r, engine_alive_w = os.pipe()  # stands for the engine's sentinel: never ready
    servers = [ctx.Process(target=sys.exit, args=(3,))]
    servers[0].start()
    try:
        engine = SimpleNamespace(process=SimpleNamespace(sentinel=engine_alive_r))
        with caplog.at_level(logging.ERROR, logger=launcher.__name__):
            assert launcher._wait([engine], servers) == 1
    finally:
        servers[0].join(10)
        os.close(engine_alive_r)
        os.close(engine_alive_w)
    assert "(codes [3])" in caplog.text, caplog.text
