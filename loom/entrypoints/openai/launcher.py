"""Which processes `loom serve` runs, and how they start and stop together.

- `--disable-frontend-multiprocessing`: one process; the engine core is a thread of it.
- default: this process is the API server; the engine core is a child process.
- `--api-server-count N > 1`: this process only supervises. It binds the port once and
  hands the socket to N API server processes (all accept on it), which all talk to the one
  engine core process. If any of them dies, the rest are stopped and it exits non-zero.
- `-dp N > 1`: N engine core processes, one per replica (`EngineProcess.start_all`); each
  API server reaches them all through one `DPClient`, which spreads its requests.

The listening socket is bound before the engine starts (a busy port fails at once), but
listened on only when an API server is ready, so early clients are refused, never hung.

Ctrl-C or SIGTERM stops every process at any time, start-up included. Should this process
die without stopping them (SIGKILL), its children stop by themselves (child_process.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import socket
import stat
import sys
import tempfile
from collections.abc import Callable, Coroutine

import msgspec
import uvicorn
import uvloop

from loom import envs
from loom.config import EngineConfig
from loom.engine.child_process import signal_on_parent_death, start_child
from loom.engine.launcher import EngineEndpoint, EngineProcess
from loom.entrypoints.openai.api_server import ServerOptions, serve
from loom.frontend.core_client import EngineCoreClient, InprocClient, MPClient
from loom.frontend.dp_client import DPClient

logger = logging.getLogger(__name__)

_API_STOP_TIMEOUT_S = 15.0


def run_server(options: ServerOptions, config: EngineConfig, inproc: bool) -> int:
    """Serve until stopped. A stop asked for (Ctrl-C, SIGTERM), even while the engine is
    still starting, stops the engine core and its workers and returns 0 with one log line."""
    if options.uds:
        sock = bind_unix_socket(options.uds)
    else:
        sock = bind_socket(options.host, options.port)
        options = msgspec.structs.replace(options, port=sock.getsockname()[1])
    previous = _stop_signals_interrupt()
    try:
        return _run(options, sock, config, inproc)
    except KeyboardInterrupt as e:
        how = "SIGTERM" if isinstance(e, _Terminated) else "Ctrl-C"
        logger.info("interrupted by %s; the engine is stopped", how)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
        if options.uds:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(options.uds)


def _stop_signals_interrupt() -> dict:
    """Until uvicorn takes the signals over, SIGTERM (kill, docker stop) interrupts start-up
    as Ctrl-C does, so the engine core is stopped on the way out (EngineProcess.start_all), not
    left to finish loading for nobody. Ctrl-C raises at once, not when a blocking start-up
    step returns (asyncio's own handler only cancels the task). An ignored SIGINT (nohup,
    `cmd &` in a script) stays ignored. Returns the handlers to restore."""
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, _interrupt)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, _interrupt)
    return previous


def _run(options: ServerOptions, sock: socket.socket, config: EngineConfig, inproc: bool) -> int:
    if inproc:
        return run_api(options, sock, lambda: InprocClient(config, options.log_stats))
    engines = EngineProcess.start_all(config, options.log_stats)
    try:
        if options.api_server_count == 1:
            endpoints = [engine.endpoint for engine in engines]
            return run_api(options, sock, lambda: engine_client(endpoints, 0))
        return _supervise(options, sock, engines)
    finally:
        for engine in engines:
            engine.stop()


def run_with_engine(config: EngineConfig, log_stats: bool, inproc: bool,
                    main: Callable[[Callable[[], EngineCoreClient]], Coroutine[None, None, int]],
                    name: str) -> int:
    """Run main(make_client) on uvloop beside the engine core (a thread of this process with
    inproc, else its own process, or one per -dp replica): `loom run-batch`'s frontend, one
    without a socket. Ctrl-C or SIGTERM, start-up included, stops the engine; then 130."""
    previous = _stop_signals_interrupt()
    engines: list[EngineProcess] = []
    try:
        if inproc:
            make_client = functools.partial(InprocClient, config, log_stats)
        else:
            engines = EngineProcess.start_all(config, log_stats)
            endpoints = [engine.endpoint for engine in engines]
            make_client = functools.partial(engine_client, endpoints, 0)
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main(make_client))
    except KeyboardInterrupt as e:
        how = "SIGTERM" if isinstance(e, _Terminated) else "Ctrl-C"
        logger.info("%s interrupted by %s; the engine is stopped", name, how)
        return 130
    finally:
        for engine in engines:
            engine.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def engine_client(endpoints: list[EngineEndpoint], index: int) -> EngineCoreClient:
    """API server `index`'s client of the engine core, or of each -dp replica."""
    if len(endpoints) == 1:
        return MPClient(endpoints[0], index)
    return DPClient([MPClient(endpoint, index) for endpoint in endpoints])


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError(f"host: cannot resolve {host!r}: "
                         f"{getattr(e, 'strerror', None) or e}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"port: cannot bind {host}:{port}: {e.strerror}") from None
    return sock


def bind_unix_socket(path: str) -> socket.socket:
    """--uds: a Unix domain socket at path; a socket file left there by an earlier server is
    replaced, anything else there is refused."""
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise ValueError(f"uds: {path} exists and is not a socket")
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    except OSError as e:
        sock.close()
        raise ValueError(f"uds: cannot bind {path}: {e.strerror}") from None
    return sock


class _Server(uvicorn.Server):
    """uvicorn, minus re-raising the stop signal once it has shut down (which would kill
    this process before the engine is stopped in order)."""

    def __init__(self, config: uvicorn.Config, stop_signals: tuple[int, ...]) -> None:
        super().__init__(config)
        self.stop_signals = stop_signals

    @contextlib.contextmanager
    def capture_signals(self):
        loop = asyncio.get_running_loop()
        for sig in self.stop_signals:
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in self.stop_signals:
                loop.remove_signal_handler(sig)


def run_api(options: ServerOptions, sock: socket.socket,
            make_client: Callable[[], EngineCoreClient],
            stop_signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> int:
    make_server = functools.partial(_Server, stop_signals=stop_signals)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(options, sock, make_client, make_server))


def run_api_process(options_json: bytes, endpoints_json: bytes, index: int,
                    sock: socket.socket) -> None:
    """Target of each API server process (spawned) when there are several."""
    # Ctrl-C reaches every process of the group; the supervisor alone decides, with SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    # A supervisor killed outright must not leave this server holding the port.
    signal_on_parent_death(signal.SIGTERM, f"API server {index}")
    options = msgspec.json.decode(options_json, type=ServerOptions)
    endpoints = msgspec.json.decode(endpoints_json, type=list[EngineEndpoint])
    try:
        code = run_api(options, sock, lambda: engine_client(endpoints, index),
                       (signal.SIGTERM,))
    except ValueError as e:
        # A bad setting (e.g. --chat-template), the same in every API server: one line each,
        # as the CLI prints it, not a traceback from each.
        print(f"loom serve: error: {e}", file=sys.stderr)
        code = 2
    sys.exit(code)


def _supervise(options: ServerOptions, sock: socket.socket, engines: list[EngineProcess]) -> int:
    metrics_dir = _share_metrics()
    ctx = multiprocessing.get_context("spawn")
    args = (msgspec.json.encode(options), msgspec.json.encode([e.endpoint for e in engines]))
    servers = [ctx.Process(target=run_api_process, name=f"loom-api-{i}", args=(*args, i, sock))
               for i in range(options.api_server_count)]
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        for p in servers:
            start_child(p, ignore_sigint=True)
        return _wait(engines, servers)
    except KeyboardInterrupt:
        logger.info("stopping %d API servers", len(servers))
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        _stop_all(servers)
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _wait(engines: list[EngineProcess], servers: list) -> int:
    """Block until a process exits on its own; that is always a failure."""
    sentinels = {p.sentinel: p for p in servers}
    engine_sentinels = {e.process.sentinel for e in engines}
    ready = multiprocessing.connection.wait([*engine_sentinels, *sentinels])
    if engine_sentinels.intersection(ready):
        # Each API server ends its requests with errors and exits by itself; let them.
        logger.error("engine core died; waiting for the API servers to exit")
        for p in servers:
            p.join(envs.engine_dead_linger_s() + _API_STOP_TIMEOUT_S)
        return 1
    dead = [sentinels[s] for s in ready]
    for p in dead:
        p.join(_API_STOP_TIMEOUT_S)  # its sentinel fires a moment before its exit code is known
    logger.error("API server(s) %s exited (codes %s); stopping the rest",
                 [p.pid for p in dead], [p.exitcode for p in dead])
    return 1


def _stop_all(servers: list) -> None:
    servers = [p for p in servers if p.pid is not None]  # interrupted before starting them all
    for p in servers:
        if p.is_alive():
            os.kill(p.pid, signal.SIGTERM)
    for p in servers:
        p.join(_API_STOP_TIMEOUT_S)
        if p.is_alive():
            logger.error("API server %d did not stop; killing it", p.pid)
            p.kill()
            p.join()


def _share_metrics() -> str | None:
    """Prometheus multiprocess mode, so any API server's /metrics covers them all. Set
    before the API servers start (prometheus_client reads it at import); a directory the
    user chose is kept."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    path = tempfile.mkdtemp(prefix="loom-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt, so both stop alike."""


def _interrupt(signum, _frame) -> None:
    raise _Terminated if signum == signal.SIGTERM else KeyboardInterrupt
