"""Data parallelism (vLLM's `-dp N`): N engine cores, each a whole replica of the model on
its own devices, behind one `EngineCoreClient`.

Each new request goes to the replica with the fewest of this client's requests in flight
(the next one in turn among equals), and stays there: its aborts follow it. Utility calls
go to every replica and answer once, their results combined (counts summed, KV blocks
summed, a flag true only if every replica's is). Scheduler stats are passed on as they
come, with the gauges (running, waiting, KV usage, the LoRA adapters in use) made the
whole server's from each replica's latest, so that /metrics counts every replica. The first
replica to fail ends the server: its `EngineDead` is passed on, naming it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import msgspec

from loom.engine.protocol import (AbortRequests, EngineCoreInput, EngineCoreMessage,
                                  EngineCoreRequest, EngineDead, SchedulerStats, UtilityCall,
                                  UtilityResult)
from loom.frontend.core_client import EngineCoreClient, MessageHandler


def _kv_info(results: list[Any]) -> Any:
    total = dict(results[0])
    for key in ("num_blocks", "num_free_blocks"):
        total[key] = sum(r[key] for r in results)
    return total


_COMBINE: dict[str, Callable[[list[Any]], Any]] = {
    "get_num_unfinished_requests": sum,
    "reset_prefix_cache": all,
    "get_kv_info": _kv_info,
    "sleep": sum,
    "is_sleeping": any,
    "call_workers": lambda results: [r for replica in results for r in replica],
}
"""How the replicas' answers to a utility method become one; others: the first replica's
(the model's facts, the same in each)."""


class DPClient(EngineCoreClient):
    def __init__(self, clients: list[EngineCoreClient]) -> None:
        self.clients = clients
        # A request must fit one replica's KV cache; each has its own.
        self.info = msgspec.structs.replace(
            clients[0].info, num_blocks=min(c.info.num_blocks for c in clients))
        self.engine_pid = clients[0].engine_pid
        self.in_flight = [0] * len(clients)
        """This client's requests in flight on each replica."""
        self.routed = [0] * len(clients)
        """The requests this client has sent each replica."""
        self._owner: dict[str, int] = {}
        self._next = 0
        self._calls: dict[int, tuple[str, list[UtilityResult | None]]] = {}
        """A utility call in flight -> its method and each replica's answer so far."""
        self._stats: list[SchedulerStats | None] = [None] * len(clients)
        self._on_message: MessageHandler | None = None
        self._dead = False

    @property
    def engine_pids(self) -> list[int | None]:
        return [client.engine_pid for client in self.clients]

    def start(self, on_message: MessageHandler) -> None:
        self._on_message = on_message
        for index, client in enumerate(self.clients):
            client.start(functools.partial(self._deliver, index))

    def send(self, message: EngineCoreInput) -> None:
        if isinstance(message, EngineCoreRequest):
            index = self._pick()
            self._owner[message.request_id] = index
            self.in_flight[index] += 1
            self.routed[index] += 1
            self.clients[index].send(message)
        elif isinstance(message, AbortRequests):
            by_replica: dict[int, list[str]] = {}
            for request_id in message.request_ids:
                index = self._owner.pop(request_id, None)
                if index is not None:
                    self.in_flight[index] -= 1
                    by_replica.setdefault(index, []).append(request_id)
            for index, ids in by_replica.items():
                self.clients[index].send(AbortRequests(ids))
        else:
            if isinstance(message, UtilityCall):
                self._calls[message.call_id] = (message.method, [None] * len(self.clients))
            for client in self.clients:
                client.send(message)

    def _pick(self) -> int:
        """The replica with the fewest requests in flight, taking turns among equals."""
        n, least = len(self.clients), min(self.in_flight)
        index = next(i % n for i in range(self._next, self._next + n)
                     if self.in_flight[i % n] == least)
        self._next = index + 1
        return index

    def _deliver(self, index: int, message: EngineCoreMessage) -> None:
        if self._dead:
            return
        if isinstance(message, EngineDead):
            self._dead = True
            self._on_message(EngineDead(f"engine core replica {index} of "
                                        f"{len(self.clients)}: {message.reason}"))
            return
        for output in message.outputs:
            if output.finished and self._owner.pop(output.request_id, None) is not None:
                self.in_flight[index] -= 1
        replace: dict[str, Any] = {}
        if message.utility_results:
            replace["utility_results"] = self._combine(index, message.utility_results)
        if message.scheduler_stats is not None:
            replace["scheduler_stats"] = self._whole_server(index, message.scheduler_stats)
        self._on_message(msgspec.structs.replace(message, **replace) if replace else message)

    def _combine(self, index: int, results: list[UtilityResult]) -> list[UtilityResult]:
        """The calls whose every replica has now answered, each as one result."""
        done = []
        for result in results:
            method, answers = self._calls.get(result.call_id, (None, None))
            if answers is None:
                continue
            answers[index] = result
            if any(a is None for a in answers):
                continue
            del self._calls[result.call_id]
            errors = [a.error for a in answers if a.error is not None]
            if errors:
                done.append(UtilityResult(result.call_id, error=errors[0]))
                continue
            combine = _COMBINE.get(method, lambda values: values[0])
            done.append(UtilityResult(result.call_id, combine([a.result for a in answers])))
        return done

    def _whole_server(self, index: int, stats: SchedulerStats) -> SchedulerStats:
        self._stats[index] = stats
        latest = [s for s in self._stats if s is not None]
        return msgspec.structs.replace(
            stats, num_running=sum(s.num_running for s in latest),
            num_waiting=sum(s.num_waiting for s in latest),
            kv_cache_usage=sum(s.kv_cache_usage for s in latest) / len(self.clients),
            running_lora_adapters=sorted({a for s in latest for a in s.running_lora_adapters}),
            waiting_lora_adapters=sorted({a for s in latest for a in s.waiting_lora_adapters}))

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

