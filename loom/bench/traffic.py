"""When requests are sent: a Poisson (or gamma, for burstiness) arrival process, an optional
cap on requests in flight, and the loop that sends them on that schedule."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

import aiohttp
import numpy as np
from tqdm import tqdm

from loom.bench.client import RequestInput, RequestOutcome, send_request


def arrival_times(count: int, rate: float, burstiness: float,
                  rng: np.random.Generator) -> np.ndarray:
    """Send times in seconds from the start, the first at 0.

    Gaps are gamma-distributed with mean 1 / rate and shape `burstiness`: 1 is a Poisson
    process (exponential gaps), lower is burstier, higher more regular. An infinite rate sends
    everything at once.
    """
    if rate <= 0 or burstiness <= 0:
        raise ValueError(f"request_rate and burstiness must be positive, got {rate}, {burstiness}")
    if math.isinf(rate) or count <= 1:
        return np.zeros(count)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


async def drive(session: aiohttp.ClientSession, inputs: Sequence[RequestInput],
                offsets: np.ndarray, max_concurrency: int | None,
                desc: str = "Requests") -> tuple[list[RequestOutcome], float]:
    """Send each input at its offset; returns the outcomes (input order) and the duration.

    With `max_concurrency`, a request whose time has come waits for a free slot; its timings
    start when it is actually sent.
    """
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    bar = tqdm(total=len(inputs), desc=desc, unit="req")
    start = time.perf_counter()

    async def one(req: RequestInput) -> RequestOutcome:
        if slots is None:
            outcome = await send_request(session, req, start)
        else:
            async with slots:
                outcome = await send_request(session, req, start)
        bar.update(1)
        return outcome

    tasks = []
    try:
        for offset, req in zip(offsets, inputs):
            delay = start + float(offset) - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival process itself, not a synchronisation
            tasks.append(asyncio.create_task(one(req)))
        outcomes = list(await asyncio.gather(*tasks))
        duration = time.perf_counter() - start
    finally:
        for task in tasks:  # only unfinished ones, when interrupted
            task.cancel()
        bar.close()
    return outcomes, duration
