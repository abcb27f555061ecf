"""The engine core's busy loop, the same whether its frontend is a thread or a process away.

Drain every queued input (add, abort, utility), then step while there is work; when there
is none, block on the input queue. Outputs are routed to the client that owns each request,
so several API server processes can share one engine core.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from typing import TYPE_CHECKING

from loom.engine.protocol import (CALL_ERRORS, AbortRequests, EngineCoreInput, EngineCoreMessage,
                                  EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest,
                                  FinishReason, SchedulerStats, Shutdown, UtilityCall,
                                  UtilityResult, call_error)
from loom.engine.stats_log import StatsLogger, gauges_only, merge_stats

if TYPE_CHECKING:
    from loom.engine.core import EngineCore

logger = logging.getLogger(__name__)

ClientInput = tuple[int, EngineCoreInput]
"""(client index, message): the index says where the answers go."""
SendFn = Callable[[int | None, EngineCoreMessage], None]
"""Deliver to one client, or to every client for None."""


class EngineLoop:
    def __init__(self, core: EngineCore, inputs: queue.SimpleQueue[ClientInput], send: SendFn,
                 stats_logger: StatsLogger) -> None:
        self.core = core
        self.inputs = inputs
        self.send = send
        self.stats_logger = stats_logger
        self.owners: dict[str, int] = {}
        """Engine request id -> the client that added it."""
        self._unsent_stats: SchedulerStats | None = None
        self._last_client = 0
        self._needs_step = False
        self._stopped = False

    def run(self) -> None:
        """Returns after a Shutdown input; any exception escapes to the caller, which
        reports the engine dead."""
        while not self._stopped:
            self._drain(block=not self.core.has_unfinished_requests())
            if self._stopped:
                break
            if self.core.has_unfinished_requests() or self._needs_step:
                self._step()
            self.stats_logger.maybe_log()

    # -- inputs ---------------------------------------------------------------------------

    def _drain(self, block: bool) -> None:
        if block and not self._needs_step:
            try:
                self._handle(*self.inputs.get(timeout=self.stats_logger.seconds_until_due()))
            except queue.Empty:
                return  # a stats line fell due while idle
        while not self._stopped:
            try:
                item = self.inputs.get_nowait()
            except queue.Empty:
                return
            self._handle(*item)

    def _handle(self, client: int, message: EngineCoreInput) -> None:
        if isinstance(message, EngineCoreRequest):
            self._add(client, message)
        elif isinstance(message, AbortRequests):
            self.core.abort_requests(message.request_ids)
            self._needs_step = True  # the abort outputs go out with the next step
        elif isinstance(message, UtilityCall):
            self._utility(client, message)
        elif isinstance(message, Shutdown):
            self._stopped = True
        elif isinstance(message, BaseException):
            raise RuntimeError(f"engine core input failed: {message}") from message
        else:
            raise TypeError(f"engine loop: unexpected input {type(message).__name__}")

    def _add(self, client: int, request: EngineCoreRequest) -> None:
        try:
            self.core.add_request(request)
        except ValueError as e:
            # Invalid input is the request's error, never the engine's.
            error = EngineCoreOutput(request.request_id, [], finish_reason=FinishReason.ERROR,
                                     error=str(e))
            self.send(client, EngineCoreOutputs(outputs=[error]))
            return
        self.owners[request.request_id] = client
        self._needs_step = True

    def _utility(self, client: int, call: UtilityCall) -> None:
        try:
            result = UtilityResult(call.call_id, self.core.call_utility(call.method, call.args))
        except CALL_ERRORS as e:
            result = UtilityResult(call.call_id, error=call_error(e))
        # Outputs a utility left (a sleep's aborts, steps collected before a worker call)
        # go out with the next step, which must then come even if nothing else runs.
        self._needs_step = self._needs_step or self.core.has_pending_outputs()
        self.send(client, EngineCoreOutputs(utility_results=[result],
                                            scheduler_stats=self._take_stats()))

    # -- step and route -------------------------------------------------------------------

    def _step(self) -> None:
        self._needs_step = False
        step = self.core.step()
        self.stats_logger.record(step.scheduler_stats)
        if step.scheduler_stats is not None:
            self._unsent_stats = merge_stats(self._unsent_stats, step.scheduler_stats)
        for client, outputs in self._route(step.outputs).items():
            self._last_client = client
            self.send(client, EngineCoreOutputs(outputs=outputs, timestamp=step.timestamp,
                                                scheduler_stats=self._take_stats()))
        if not self.core.has_unfinished_requests():
            # Going idle: no frontend's gauges may stay at a busy value. Counters (deltas)
            # go to one client; the idle gauges to every client, since each API process
            # keeps its own and /metrics shows whichever was set last.
            if self._unsent_stats is not None:
                self.send(self._last_client, EngineCoreOutputs(
                    timestamp=step.timestamp, scheduler_stats=self._take_stats()))
            if step.scheduler_stats is not None:
                self.send(None, EngineCoreOutputs(
                    timestamp=step.timestamp, scheduler_stats=gauges_only(step.scheduler_stats)))

    def _route(self, outputs: list[EngineCoreOutput]) -> dict[int, list[EngineCoreOutput]]:
        by_client: dict[int, list[EngineCoreOutput]] = {}
        for out in outputs:
            client = self.owners.pop(out.request_id) if out.finished else self.owners.get(out.request_id)
            if client is None:
                logger.warning("engine loop: output for unknown request %r dropped", out.request_id)
                continue
            by_client.setdefault(client, []).append(out)
        return by_client

    def _take_stats(self) -> SchedulerStats | None:
        # Counters are deltas: each reaches exactly one client, so summing over clients
        # (Prometheus multiprocess mode) counts every token once.
        stats, self._unsent_stats = self._unsent_stats, None
        return stats
