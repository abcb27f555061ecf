"""Start and stop an engine core process (the launcher's side; torch-free).

The process is started with multiprocessing's spawn method: a fresh interpreter with the
parent's environment unchanged. Its arguments are bytes and strings (the config travels as
msgspec JSON). Readiness is a message over a pipe, waited for together with the process's
exit, so a crash during startup is reported at once, never waited out.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import tempfile

import msgspec

from loom import envs
from loom.config import EngineConfig
from loom.engine.child_process import start_child
from loom.engine.protocol import EngineDead, EngineReady, EngineStartup

logger = logging.getLogger(__name__)

_STOP_TIMEOUT_S = 10.0


class EngineEndpoint(msgspec.Struct, frozen=True):
    """All a frontend client needs to reach a running engine core."""
    input_addr: str
    output_addr: str
    pid: int
    info: EngineReady


class EngineProcess:
    def __init__(self, process: multiprocessing.process.BaseProcess, endpoint: EngineEndpoint,
                 ipc_dir: str) -> None:
        self.process = process
        self.endpoint = endpoint
        self._ipc_dir = ipc_dir

    @classmethod
    def start(cls, config: EngineConfig, log_stats: bool = True) -> EngineProcess:
        """One engine core (data_parallel_size 1)."""
        return cls.start_all(config, log_stats)[0]

    @classmethod
    def start_all(cls, config: EngineConfig, log_stats: bool = True) -> list[EngineProcess]:
        """An engine core per data-parallel replica, all loading at once; if one fails to
        start, those already started are stopped."""
        started: list[tuple] = []
        try:
            for rank in range(config.parallel.data_parallel_size):
                started.append(_spawn(config, log_stats, rank))
            infos = _wait_all_ready(started)
            engines = [cls(process, EngineEndpoint(*_addresses(ipc_dir), process.pid, info),
                           ipc_dir) for (process, _, ipc_dir), info in zip(started, infos)]
        except BaseException:
            # Ctrl-C or SIGTERM too: the core's SIGTERM handler cuts its start-up short.
            for process, _, ipc_dir in started:
                cls._reap(process)
                shutil.rmtree(ipc_dir, ignore_errors=True)
            raise
        finally:
            for _, reader, _ in started:
                reader.close()
        for rank, engine in enumerate(engines):
            info = engine.endpoint.info
            which = f" (replica {rank} of {len(engines)})" if len(engines) > 1 else ""
            logger.info("engine core process %d ready%s: %d KV blocks of %d tokens, "
                        "max_model_len %d", engine.process.pid, which, info.num_blocks,
                        info.block_size, info.max_model_len)
        return engines

    def stop(self) -> int | None:
        """Stop the engine (SIGTERM asks its loop to finish, or cuts its start-up short and
        stops its workers), then remove its sockets. Returns its exit code."""
        self._reap(self.process)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
        return self.process.exitcode

    @staticmethod
    def _reap(process: multiprocessing.process.BaseProcess) -> None:
        if process.is_alive():
            os.kill(process.pid, signal.SIGTERM)
            process.join(_STOP_TIMEOUT_S)
        if process.is_alive():
            logger.error("engine core %d did not stop within %.0f s; killing it", process.pid,
                         _STOP_TIMEOUT_S)
            process.kill()
            process.join()


def _addresses(ipc_dir: str) -> tuple[str, str]:
    return f"ipc://{ipc_dir}/input", f"ipc://{ipc_dir}/output"


def _spawn(config: EngineConfig, log_stats: bool, rank: int) -> tuple:
    """Start replica `rank`'s engine core process: (process, its readiness pipe, its
    socket directory)."""
    from loom.engine.core_proc import run_engine_core
    # A private directory (mode 0700) holds the sockets: no other user can reach them.
    ipc_dir = tempfile.mkdtemp(prefix="loom-")
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    name = "loom-engine-core" + (f"-{rank}" if config.parallel.data_parallel_size > 1 else "")
    process = ctx.Process(target=run_engine_core, name=name,
                          args=(msgspec.json.encode(config), *_addresses(ipc_dir), writer,
                                log_stats, rank))
    try:
        start_child(process, ignore_sigint=True)  # the launcher decides how it stops
    except BaseException:
        reader.close()
        shutil.rmtree(ipc_dir, ignore_errors=True)
        raise
    finally:
        writer.close()
    return process, reader, ipc_dir


def _wait_all_ready(started: list[tuple]) -> list[EngineReady]:
    """Each replica's readiness, taken as each says it: a replica that fails is reported at
    once, not after the others have loaded."""
    infos: dict[int, EngineReady] = {}
    while len(infos) < len(started):
        waiting = [i for i in range(len(started)) if i not in infos]
        multiprocessing.connection.wait(
            [w for i in waiting for w in (started[i][1], started[i][0].sentinel)],
            envs.engine_start_timeout_s())
        ready = [i for i in waiting if started[i][1].poll() or not started[i][0].is_alive()]
        if not ready:
            raise RuntimeError(_not_started())
        for i in ready:
            infos[i] = _wait_ready(started[i][0], started[i][1])
    return [infos[i] for i in range(len(started))]


def _not_started() -> str:
    return (f"engine core did not start within {envs.engine_start_timeout_s():.0f} s "
            "(LOOM_ENGINE_START_TIMEOUT_S)")


def _wait_ready(process, reader: multiprocessing.connection.Connection) -> EngineReady:
    timeout = envs.engine_start_timeout_s()
    ready = multiprocessing.connection.wait([reader, process.sentinel], timeout)
    if not ready:
        raise RuntimeError(_not_started())
    try:
        message = msgspec.msgpack.decode(reader.recv_bytes(), type=EngineStartup)
    except EOFError:
        process.join()
        raise RuntimeError(f"engine core process exited with code {process.exitcode} before "
                           "it was ready; see its log above") from None
    if isinstance(message, EngineDead):
        raise ValueError(f"engine core could not start: {message.reason}")
    return message
