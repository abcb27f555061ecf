"""How the API process reaches the engine core: one interface, two transports.

- `InprocClient` (`--disable-frontend-multiprocessing`): the engine's busy loop runs in a
  background thread of this process; messages pass by reference.
- `MPClient`: the engine core is another process; one DEALER socket carries inputs to it
  and one carries its outputs back, over ipc:// (never a socket per request). Sends never
  block (no high-water mark); receives run in one asyncio task.

Either way, every engine message is handed to `on_message` on the event loop thread, and
the engine's death (an `EngineDead` message, its thread failing, or its process exiting)
arrives there as an `EngineDead`.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import os
import queue
import threading
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio

from loom import envs
from loom.engine.core_loop import ClientInput, EngineLoop
from loom.engine.core_proc import client_routing_id
from loom.engine.launcher import EngineEndpoint
from loom.engine.protocol import (ClientHello, EngineCoreInput, EngineCoreMessage, EngineDead,
                                  EngineReady, Shutdown)
from loom.engine.stats_log import StatsLogger

logger = logging.getLogger(__name__)

MessageHandler = Callable[[EngineCoreMessage], None]

_THREAD_STOP_TIMEOUT_S = 10.0


class EngineCoreClient(abc.ABC):
    """Methods are called on the event loop thread; none of them blocks."""

    info: EngineReady
    engine_pid: int | None = None

    @property
    def engine_pids(self) -> list[int | None]:
        """Each engine core process's pid (several under data parallelism)."""
        return [self.engine_pid]

    @abc.abstractmethod
    def start(self, on_message: MessageHandler) -> None:
        """Start delivering engine messages; call from inside the running event loop."""

    @abc.abstractmethod
    def send(self, message: EngineCoreInput) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...


class InprocClient(EngineCoreClient):
    def __init__(self, config, log_stats: bool = True) -> None:
        from loom.engine.core import EngineCore  # torch enters this process only in this mode
        self.core = EngineCore(config)
        self.info = EngineReady.of(self.core)
        self.inputs: queue.SimpleQueue[ClientInput] = queue.SimpleQueue()
        self._log_stats = log_stats
        self._thread: threading.Thread | None = None

    def start(self, on_message: MessageHandler) -> None:
        loop = asyncio.get_running_loop()

        def deliver(_client: int, message: EngineCoreMessage) -> None:
            loop.call_soon_threadsafe(on_message, message)

        engine_loop = EngineLoop(self.core, self.inputs, deliver,
                                 StatsLogger(envs.log_stats_interval_s(), self._log_stats))
        self._thread = threading.Thread(target=self._run, args=(engine_loop, deliver),
                                        name="loom-engine-core", daemon=True)
        self._thread.start()

    def _run(self, engine_loop: EngineLoop, deliver) -> None:
        try:
            engine_loop.run()
        except BaseException as e:  # noqa: BLE001 - any failure ends the engine, loudly
            logger.exception("engine core loop failed")
            deliver(0, EngineDead(f"engine core failed: {type(e).__name__}: {e}"))
        finally:
            self.core.shutdown()

    def send(self, message: EngineCoreInput) -> None:
        self.inputs.put((0, message))

    async def close(self) -> None:
        if self._thread is None:
            self.core.shutdown()
            return
        self.inputs.put((0, Shutdown()))
        # The current step finishes first; wait off the event loop.
        await asyncio.to_thread(self._thread.join, _THREAD_STOP_TIMEOUT_S)
        if self._thread.is_alive():
            logger.error("engine core thread did not stop within %.0f s", _THREAD_STOP_TIMEOUT_S)


class MPClient(EngineCoreClient):
    def __init__(self, endpoint: EngineEndpoint, client_index: int) -> None:
        self.info = endpoint.info
        self.engine_pid = endpoint.pid
        self.client_index = client_index
        self._encoder = msgspec.msgpack.Encoder()
        self._ctx = zmq.Context()
        self._input = self._connect(endpoint.input_addr)
        output = self._connect(endpoint.output_addr)
        output.send(self._encoder.encode(ClientHello(client_index)))
        self._output_sync = output
        self._output = zmq.asyncio.Socket.from_socket(output)
        self._pidfd = os.pidfd_open(endpoint.pid)
        self._recv_task: asyncio.Task | None = None
        self._on_message: MessageHandler | None = None

    def _connect(self, addr: str) -> zmq.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.ROUTING_ID, client_routing_id(self.client_index))
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.connect(addr)
        return sock

    def start(self, on_message: MessageHandler) -> None:
        self._on_message = on_message
        loop = asyncio.get_running_loop()
        self._recv_task = loop.create_task(self._recv_loop(), name="loom-engine-outputs")
        # The engine may die without a word (killed, OOM): its pidfd turns readable.
        loop.add_reader(self._pidfd, self._on_engine_exit)

    def send(self, message: EngineCoreInput) -> None:
        self._input.send(self._encoder.encode(message), zmq.NOBLOCK, copy=False)

    async def _recv_loop(self) -> None:
        decoder = msgspec.msgpack.Decoder(EngineCoreMessage)
        while True:
            frame = await self._output.recv(copy=False)
            if not self._deliver(decoder, frame.buffer):
                return

    def _deliver(self, decoder: msgspec.msgpack.Decoder, frame) -> bool:
        """Hand one frame on; False once the engine has declared itself dead."""
        try:
            message = decoder.decode(frame)
        except msgspec.DecodeError as e:
            message = EngineDead(f"malformed frame from the engine core: {e}")
        self._on_message(message)
        return not isinstance(message, EngineDead)

    def _on_engine_exit(self) -> None:
        asyncio.get_running_loop().remove_reader(self._pidfd)
        if self._recv_task is None or self._recv_task.done():
            return  # it already said EngineDead, or we are closing
        self._recv_task.cancel()
        # Hand on what it sent before it died: its own EngineDead names the cause.
        decoder = msgspec.msgpack.Decoder(EngineCoreMessage)
        while True:
            try:
                frame = self._output_sync.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            if not self._deliver(decoder, frame):
                return
        self._on_message(EngineDead(f"engine core process {self.engine_pid} exited"))

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        if self._recv_task is not None:
            self._recv_task.cancel()
            await asyncio.gather(self._recv_task, return_exceptions=True)
        self._input.close(linger=0)
        self._output.close(linger=0)
        self._ctx.term()
