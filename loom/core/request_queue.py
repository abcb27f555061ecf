"""The scheduler's waiting queue, by scheduling policy (vLLM's --scheduling-policy).

fcfs: first come, first served; a preempted request goes back to the front, so that it
resumes before anything newer. priority: ordered by (priority, arrival time), lower first;
a preempted request goes back to its own place in that order.

The queue also says where an admitted request joins the running list: in the same order,
so that the running list's last request is always the one to preempt (fcfs: the most
recently admitted; priority: the largest (priority, arrival time), as vLLM's max()).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator

from loom.config import SCHEDULING_POLICIES
from loom.core.request import Request


class FCFSQueue:
    def __init__(self) -> None:
        self._queue: deque[Request] = deque()

    def add(self, request: Request) -> None:
        """A new request: at the back."""
        self._queue.append(request)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.popleft()

    def prepend(self, request: Request) -> None:
        """A preempted request: at the front (several, last first, keep their order)."""
        self._queue.appendleft(request)

    def put_back(self, requests: list[Request]) -> None:
        """Requests popped and passed over this step, in the order they were popped."""
        self._queue.extendleft(reversed(requests))

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    @staticmethod
    def add_running(running: list[Request], request: Request) -> None:
        running.append(request)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


def _rank(request: Request) -> tuple[int, float]:
    return request.priority, request.arrival_time


class PriorityQueue:
    """Sorted by (priority, arrival time); equal ranks keep the order they were added in."""

    def __init__(self) -> None:
        self._queue: list[Request] = []

    def add(self, request: Request) -> None:
        bisect.insort_right(self._queue, request, key=_rank)

    def peek(self) -> Request:
        return self._queue[0]

    def pop(self) -> Request:
        return self._queue.pop(0)

    prepend = add
    """A preempted request goes back to its rank's place."""

    def put_back(self, requests: list[Request]) -> None:
        # Popped from the front in order: all rank at or before what is left.
        self._queue[:0] = requests

    def remove(self, request: Request) -> None:
        self._queue.remove(request)

    @staticmethod
    def add_running(running: list[Request], request: Request) -> None:
        bisect.insort_right(running, request, key=_rank)

    def __len__(self) -> int:
        return len(self._queue)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._queue)


RequestQueue = FCFSQueue | PriorityQueue


def make_request_queue(policy: str) -> RequestQueue:
    if policy not in SCHEDULING_POLICIES:
        raise ValueError(f"scheduling_policy: {policy!r} is not one of {SCHEDULING_POLICIES}")
    return PriorityQueue() if policy == "priority" else FCFSQueue()
