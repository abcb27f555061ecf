"""The engine core process: an input thread, the busy loop, an output thread.

    frontend clients --DEALER--> [input ROUTER] -> input thread: recv + decode -> queue
                                                   busy loop (main thread): EngineLoop
    frontend clients <--DEALER-- [output ROUTER] <- output thread: encode + send <- queue

One input and one output socket for the whole engine, whatever the number of clients and
requests; a client is told apart by its ZeroMQ routing id (its index). Frames are msgpack
of the structs in `protocol.py`, decoded by typed decoders. The ZeroMQ threads release the
GIL while they wait, so they overlap with the model's forward.

Any exception in the loop sends `EngineDead` to every client and exits non-zero. If the
launching process dies, at any time, even while the engine starts, the engine shuts down
(and stops its TP workers) rather than linger as an orphan: see `child_process.py`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
from multiprocessing.connection import Connection
from typing import NoReturn

import msgspec
import zmq

from loom import envs
from loom.engine.child_process import signal_on_parent_death
from loom.engine.core_loop import ClientInput, EngineLoop
from loom.engine.protocol import (ClientHello, EngineCoreInput, EngineCoreMessage, EngineDead,
                                  EngineReady, Shutdown)
from loom.engine.stats_log import StatsLogger

logger = logging.getLogger(__name__)

_STOP = object()
_SEND_LINGER_MS = 5000
"""How long closing the output socket may wait to deliver EngineDead or the last outputs."""
_CHILD_JOIN_TIMEOUT_S = 5.0


def client_routing_id(index: int) -> bytes:
    return index.to_bytes(2, "little")


def _client_index(routing_id: bytes) -> int:
    return int.from_bytes(routing_id, "little")


def run_engine_core(config_json: bytes, input_addr: str, output_addr: str,
                    ready: Connection, log_stats: bool, dp_rank: int = 0) -> None:
    """Target of the engine core process (spawned): start, report ready, loop, exit.
    dp_rank: which of the -dp replicas this engine is (`take_devices`)."""
    # SIGTERM (the launcher stopping, or the parent watch below) is handled from the first
    # line: while starting it unwinds the build, which could otherwise leave TP workers
    # loading a model for nobody. Ctrl-C reaches the whole process group; the launcher
    # decides how the engine stops.
    signal.signal(signal.SIGTERM, _abort_startup)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        logging.basicConfig(level=logging.INFO, datefmt="%H:%M:%S",
                            format="%(levelname)s %(asctime)s %(name)s: %(message)s")
        signal_on_parent_death(signal.SIGTERM, "engine core")
        proc = _start(config_json, input_addr, output_addr, ready, log_stats, dp_rank)
    except _StartupAborted:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stopping already
        _stop_children()
        _exit(0)
    # Everything is sent and shut down. Skip the interpreter's teardown: on a GPU host its
    # exit hooks (Inductor's compile workers, CUDA caches) outlasted the launcher's 10 s.
    _exit(proc.run())


class _StartupAborted(BaseException):
    """SIGTERM while the engine core starts. Not an Exception: no `except Exception` on
    the way up may take it for a start-up failure."""


_aborting = False
"""Set by SIGTERM during start-up: what it raised may come back wrapped (a dataclass's
`__set_name__` turns it into a RuntimeError mid-import) and must still stop quietly."""


def _abort_startup(_signum, _frame) -> None:
    global _aborting
    _aborting = True
    raise _StartupAborted


def _start(config_json: bytes, input_addr: str, output_addr: str, ready: Connection,
           log_stats: bool, dp_rank: int) -> EngineCoreProc:
    """Build the engine and bind its sockets, then tell the launcher it is ready."""
    _thread_lock_for_tqdm()
    from loom.config import EngineConfig
    encoder = msgspec.msgpack.Encoder()
    try:
        config = msgspec.json.decode(config_json, type=EngineConfig)
        take_devices(config, dp_rank)  # before torch sees the GPUs
        from loom.engine.core import EngineCore
        core = EngineCore(config)
    except Exception as e:  # noqa: BLE001 - every startup failure is reported to the launcher
        if _aborting:
            raise _StartupAborted from e
        _report_failure(e, ready, encoder)
    try:
        proc = EngineCoreProc(core, input_addr, output_addr, log_stats)
    except BaseException:
        core.shutdown()
        raise
    # From here SIGTERM finishes the current step, then stops cleanly.
    signal.signal(signal.SIGTERM, lambda *_: proc.inputs.put((0, Shutdown())))
    try:
        ready.send_bytes(encoder.encode(EngineReady.of(core)))
        ready.close()
    except OSError:
        # The launcher died while this engine started: nobody will connect. Stop in order.
        logger.error("engine core: the launcher is gone; shutting down")
        proc.inputs.put((0, Shutdown()))
    return proc


def take_devices(config, dp_rank: int) -> None:
    """Data parallelism: replica `dp_rank` of -dp N sees only its own -tp GPUs, the
    dp_rank-th run of tensor_parallel_size among those CUDA_VISIBLE_DEVICES names (all of
    the host's when unset), so that its ranks 0..tp-1 are those. On the CPU nothing moves."""
    dp, tp = config.parallel.data_parallel_size, config.parallel.tensor_parallel_size
    if dp == 1 or config.device.device == "cpu":
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(dp * tp)]
    if len(devices) < dp * tp:
        raise ValueError(f"data_parallel_size: {dp} replicas of tensor_parallel_size {tp} "
                         f"need {dp * tp} GPUs; CUDA_VISIBLE_DEVICES names {len(devices)}")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices[dp_rank * tp:(dp_rank + 1) * tp])
    # Too few GPUs on the host leaves this replica none or fewer than tp: an error, not a
    # quiet fall back to the CPU (auto), where an NVIDIA driver says the host has GPUs.
    if config.device.device == "cuda" or os.path.exists("/proc/driver/nvidia/version"):
        import torch
        if torch.cuda.device_count() < tp:
            raise ValueError(f"data_parallel_size: {dp} replicas of tensor_parallel_size "
                             f"{tp} need {dp * tp} GPUs; replica {dp_rank} has "
                             f"{torch.cuda.device_count()} of its own")


def _report_failure(error: Exception, ready: Connection, encoder) -> NoReturn:
    if isinstance(error, ValueError | NotImplementedError):
        # A bad setting: the launcher prints the message; a traceback adds nothing.
        logger.debug("engine core failed to start", exc_info=True)
    else:
        logger.exception("engine core failed to start")
    try:
        ready.send_bytes(encoder.encode(EngineDead(f"{type(error).__name__}: {error}")))
        ready.close()
    except OSError:
        pass  # the launcher is gone; there is nobody to tell
    _exit(1)


def _stop_children() -> None:
    """Start-up was cut short, perhaps after the executor had started its TP workers (they
    would go on loading the model): stop them. They hold nothing worth a graceful stop."""
    children = multiprocessing.active_children()
    for child in children:
        child.kill()
    for child in children:
        child.join(_CHILD_JOIN_TIMEOUT_S)
    logger.debug("engine core: start-up cancelled; stopped %d worker process(es)", len(children))


def _exit(code: int) -> NoReturn:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _thread_lock_for_tqdm() -> None:
    """tqdm's default lock holds a multiprocessing semaphore, which this process's fast exit
    (os._exit) never unlinks: the launcher's resource tracker then warned of a leaked
    semaphore at every shutdown. The progress bars here need only a thread lock."""
    from tqdm import tqdm
    tqdm.set_lock(threading.RLock())


class EngineCoreProc:
    def __init__(self, core, input_addr: str, output_addr: str, log_stats: bool) -> None:
        self.core = core
        self.ctx = zmq.Context()
        self.input_sock = self._bind(zmq.ROUTER, input_addr)
        self.output_sock = self._bind(zmq.ROUTER, output_addr)
        # SimpleQueue: its put() is reentrant, so the SIGTERM handler may call it.
        self.inputs: queue.SimpleQueue[ClientInput] = queue.SimpleQueue()
        self.outputs: queue.SimpleQueue = queue.SimpleQueue()
        self._stop_r, self._stop_w = os.pipe()
        self.loop = EngineLoop(core, self.inputs, self._send,
                               StatsLogger(envs.log_stats_interval_s(), log_stats))
        self._threads = [threading.Thread(target=self._input_thread, name="engine-input", daemon=True),
                         threading.Thread(target=self._output_thread, name="engine-output", daemon=True)]

    def _bind(self, kind: int, addr: str) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.SNDHWM, 0)  # never drop or block on a burst of outputs
        sock.bind(addr)
        return sock

    def run(self) -> int:
        for t in self._threads:
            t.start()
        code = 0
        try:
            self.loop.run()
        except BaseException as e:  # noqa: BLE001 - any failure ends the engine, loudly
            logger.exception("engine core loop failed")
            self.outputs.put((None, EngineDead(f"engine core failed: {type(e).__name__}: {e}")))
            code = 1
        self._stop_threads()
        try:
            self.core.shutdown()
        except Exception:  # noqa: BLE001
            logger.exception("engine core shutdown failed")
            code = 1
        self.ctx.term()
        return code

    def _send(self, client: int, message: EngineCoreMessage) -> None:
        self.outputs.put((client, message))

    def _stop_threads(self) -> None:
        self.outputs.put(_STOP)  # after everything queued, so the last outputs still go out
        os.write(self._stop_w, b"x")
        for t in self._threads:
            t.join()

    # -- input thread ---------------------------------------------------------------------

    def _input_thread(self) -> None:
        decoder = msgspec.msgpack.Decoder(EngineCoreInput)
        poller = zmq.Poller()
        poller.register(self.input_sock, zmq.POLLIN)
        poller.register(self._stop_r, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll())
                if self._stop_r in events:
                    return
                routing_id, frame = self.input_sock.recv_multipart(copy=False)
                try:
                    message = decoder.decode(frame.buffer)
                except msgspec.DecodeError as e:
                    logger.error("engine core: dropped a malformed input frame: %s", e)
                    continue
                self.inputs.put((_client_index(routing_id.bytes), message))
        except Exception as e:  # noqa: BLE001 - the busy loop re-raises it and dies loudly
            self.inputs.put((0, e))
        finally:
            self.input_sock.close(linger=0)

    # -- output thread --------------------------------------------------------------------

    def _output_thread(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        hello = msgspec.msgpack.Decoder(ClientHello)
        known: set[int] = set()
        try:
            while (item := self.outputs.get()) is not _STOP:
                client, message = item
                frame = encoder.encode(message)
                for target in (sorted(known) if client is None else [client]):
                    if self._await_hello(target, known, hello):
                        self.output_sock.send_multipart([client_routing_id(target), frame],
                                                        copy=False)
        finally:
            self.output_sock.close(linger=_SEND_LINGER_MS)

    def _await_hello(self, client: int, known: set[int], decoder: msgspec.msgpack.Decoder) -> bool:
        """A ROUTER silently drops what it sends to a peer it has not yet heard from; every
        client says hello on this socket before it sends any request, so wait for it."""
        poller = zmq.Poller()
        for source in (self.output_sock, self._stop_r):
            poller.register(source, zmq.POLLIN)
        while client not in known:
            if self.output_sock not in dict(poller.poll()):
                logger.error("engine core: output for client %d dropped: it never connected", client)
                return False  # stopping
            routing_id, frame = self.output_sock.recv_multipart()
            try:
                decoder.decode(frame)
            except msgspec.DecodeError as e:
                logger.error("engine core: dropped a malformed hello frame: %s", e)
                continue
            known.add(_client_index(routing_id))
        return True
