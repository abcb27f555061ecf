"""The main loop of one tensor-parallel worker process."""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback

import msgspec
import zmq

from loom.config import EngineConfig
from loom.engine.child_process import signal_on_parent_death
from loom.engine.protocol import CALL_ERRORS, call_error
from loom.executor.protocol import (CollectiveRPC, ExecuteModel, FlushOutput, RPCReply,
                                    RunnerOutput, ShutdownWorker, WorkerCommand, WorkerFailed,
                                    WorkerReady)

logger = logging.getLogger(__name__)


def worker_main(config: EngineConfig, rank: int, init_method: str, command_addr: str,
                reply_addr: str) -> None:
    logging.basicConfig(level=logging.INFO, format=f"%(levelname)s rank{rank} %(name)s: %(message)s")
    # A worker whose engine core is gone would otherwise load its model and then block in
    # commands.recv() forever (SIGINT is ignored, as the core ignores it).
    signal_on_parent_death(signal.SIGKILL, f"tensor-parallel worker rank {rank}")
    ctx = zmq.Context()
    commands = ctx.socket(zmq.PULL)
    commands.connect(command_addr)
    replies = ctx.socket(zmq.PUSH)
    replies.connect(reply_addr)
    encoder, decoder = msgspec.msgpack.Encoder(), msgspec.msgpack.Decoder(WorkerCommand)
    try:
        _limit_cpu_threads(config)
        from loom.worker.worker import Worker
        worker = Worker(config, rank, init_method)
        replies.send(encoder.encode(WorkerReady(rank)))
        _serve(worker, rank, commands, replies, encoder, decoder)
    except Exception as e:  # noqa: BLE001 - every failure is reported to the executor
        traceback.print_exc()
        replies.send(encoder.encode(WorkerFailed(rank, f"{type(e).__name__}: {e}")))
        replies.close(linger=2000)
        sys.exit(1)
    finally:
        ctx.destroy(linger=0)


def _serve(worker, rank, commands, replies, encoder, decoder) -> None:
    in_flight = None  # the last launched step, not yet read back

    def reply_output() -> None:
        # Every rank reads its step back (it records the sampled tokens); rank 0 replies.
        output = in_flight.output()
        if rank == 0:
            replies.send(encoder.encode(RunnerOutput(output)))

    while True:
        command = decoder.decode(commands.recv())
        if isinstance(command, ShutdownWorker):
            return
        if isinstance(command, ExecuteModel):
            launched = worker.launch(command.scheduler_output)
            if in_flight is not None:
                reply_output()
            in_flight = launched
        elif isinstance(command, FlushOutput):
            if in_flight is not None:
                reply_output()
                in_flight = None
        elif isinstance(command, CollectiveRPC):
            try:
                reply = RPCReply(rank, worker.rpc(command.method, command.args))
            except CALL_ERRORS as e:
                reply = RPCReply(rank, error=call_error(e))
            replies.send(encoder.encode(reply))


def _limit_cpu_threads(config: EngineConfig) -> None:
    """CPU ranks share the machine's cores; oversubscribed threads make gloo crawl."""
    import torch
    if config.device.device == "cpu" or not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.parallel.tensor_parallel_size))
