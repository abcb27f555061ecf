"""Tensor parallelism: one worker process per rank, the step broadcast over ZeroMQ.

Every rank runs in its own process, so the engine core never blocks inside a collective:
it waits on its reply socket and on the workers' process sentinels together, and a rank
that dies or raises is reported by rank and reason at once, whatever the others are
stuck in. Each step's SchedulerOutput is msgpack-encoded once and pushed to every rank.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import socket
import tempfile

import msgspec
import zmq

from loom.config import EngineConfig
from loom.engine.protocol import raise_call_error
from loom.core.sched_output import ModelRunnerOutput, SchedulerOutput
from loom.engine.child_process import start_child
from loom.executor.base import Executor
from loom.executor.protocol import (CollectiveRPC, ExecuteModel, FlushOutput, RPCReply,
                                    RunnerOutput, ShutdownWorker, WorkerFailed, WorkerMessage,
                                    WorkerReady)
from loom.executor.worker_proc import worker_main

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 600.0


class WorkerError(RuntimeError):
    """A tensor-parallel worker died or raised; the engine cannot continue."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MultiprocExecutor(Executor):
    # A rank replies to a step only once the next arrives, and the reply crosses two
    # processes before the engine can schedule again: a third step keeps every GPU fed
    # through that round trip.
    max_steps_in_flight = 3

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.world_size = config.parallel.tensor_parallel_size
        self._dir = tempfile.TemporaryDirectory(prefix="loom-tp-")
        self._ctx = zmq.Context()
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(WorkerMessage)
        self._replies = self._ctx.socket(zmq.PULL)
        self._replies.bind(f"ipc://{self._dir.name}/replies")
        self._commands = []
        self.procs: list[mp.Process] = []
        self._failed: str | None = None
        self._launched = self._collected = 0
        try:
            self._start_workers()
            self._model_info = self._rpc("model_info")[0]
        except BaseException:
            # Failed or interrupted (Ctrl-C, the engine core's SIGTERM) while the workers
            # load: nobody would ever stop them. They are mid-load and would not read a
            # ShutdownWorker, so they are killed.
            self._kill_workers()
            self._close_sockets()
            raise

    def _start_workers(self) -> None:
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        spawn = mp.get_context("spawn")
        for rank in range(self.world_size):
            cmd = self._ctx.socket(zmq.PUSH)
            addr = f"ipc://{self._dir.name}/cmd{rank}"
            cmd.bind(addr)
            self._commands.append(cmd)
            # The environment passes through unchanged (NCCL_NVLS_ENABLE etc.).
            proc = spawn.Process(target=worker_main, name=f"loom-tp{rank}", daemon=True,
                                 args=(self.config, rank, init_method, addr,
                                       f"ipc://{self._dir.name}/replies"))
            self.procs.append(proc)  # first: an interrupt right after start() must find it
            start_child(proc)
        ready = {self._receive(STARTUP_TIMEOUT_S, WorkerReady).rank for _ in range(self.world_size)}
        logger.info("started %d tensor-parallel workers (ranks %s)", self.world_size, sorted(ready))

    # Waiting: replies and worker deaths wake the same poller. -----------------------------
    def _receive(self, timeout_s: float | None, expected: type):
        if self._failed:
            # The first failure is the one to report: the survivors were killed after it,
            # and waiting again would only name one of them.
            raise WorkerError(self._failed)
        poller = zmq.Poller()
        poller.register(self._replies, zmq.POLLIN)
        for proc in self.procs:
            poller.register(proc.sentinel, zmq.POLLIN)
        events = dict(poller.poll(None if timeout_s is None else timeout_s * 1000))
        if self._replies in events:
            message = self._decoder.decode(self._replies.recv())
            if isinstance(message, WorkerFailed):
                self._fail(f"tensor-parallel worker rank {message.rank} failed: {message.error}")
            if not isinstance(message, expected):
                self._fail(f"unexpected worker message {type(message).__name__}")
            return message
        for rank, proc in enumerate(self.procs):
            if proc.sentinel in events:
                proc.join(timeout=5)  # the sentinel closes a moment before the exit is reaped
                self._fail(f"tensor-parallel worker rank {rank} died (exit code {proc.exitcode})")
        self._fail(f"no reply from the tensor-parallel workers within {timeout_s} s")

    def _fail(self, reason: str):
        # Take everything down: survivors may be blocked in a collective with the dead rank.
        self._failed = reason
        logger.error("%s; stopping all workers", reason)
        self._kill_workers()
        raise WorkerError(reason)

    def _broadcast(self, command) -> None:
        if self._failed:
            raise WorkerError(self._failed)
        frame = self._encoder.encode(command)
        for rank, cmd in enumerate(self._commands):
            try:
                # A PUSH socket whose worker died has no peer left: a blocking send would
                # wait forever, so a dead rank is reported here instead.
                cmd.send(frame, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self.procs[rank].join(timeout=5)
                self._fail(f"tensor-parallel worker rank {rank} is unreachable "
                           f"(exit code {self.procs[rank].exitcode})")

    def _rpc(self, method: str, *args) -> list:
        self._broadcast(CollectiveRPC(method, list(args)))
        replies = [self._receive(STARTUP_TIMEOUT_S, RPCReply) for _ in range(self.world_size)]
        replies.sort(key=lambda r: r.rank)
        failed = next((r.error for r in replies if r.error), None)
        if failed is not None:  # raised again as the rank raised it
            raise_call_error(failed)
        return [r.value for r in replies]

    # The executor interface. ------------------------------------------------------------
    def determine_num_blocks(self) -> int:
        return min(self._rpc("determine_num_blocks"))

    def initialize_cache(self, num_blocks: int) -> None:
        self._rpc("initialize_cache", num_blocks)

    def launch(self, so: SchedulerOutput) -> int:
        self._broadcast(ExecuteModel(so))
        self._launched += 1
        return self._launched

    def collect(self, step: int) -> ModelRunnerOutput:
        if step != self._collected + 1:
            raise RuntimeError(f"step {step} collected out of order (last {self._collected})")
        if step == self._launched:
            # Ranks reply to a step when the next one arrives; none is coming yet.
            self._broadcast(FlushOutput())
        self._collected = step
        return self._receive(None, RunnerOutput).output

    def collective_rpc(self, method: str, *args) -> list:
        return self._rpc(method, *args)

    @property
    def model_info(self) -> dict:
        return self._model_info

    def shutdown(self) -> None:
        if not self._failed and any(p.is_alive() for p in self.procs):
            try:
                self._broadcast(ShutdownWorker())
            except zmq.ZMQError:
                pass
        for proc in self.procs:
            proc.join(timeout=5)
        self._kill_workers()
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._ctx.destroy(linger=0)
        self._dir.cleanup()

    def _kill_workers(self) -> None:
        started = [proc for proc in self.procs if proc.pid is not None]
        for proc in started:
            if proc.is_alive():
                proc.kill()
        for proc in started:
            proc.join(timeout=5)
