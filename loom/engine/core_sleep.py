"""vLLM's sleep mode on the engine core: `sleep` pauses scheduling and frees the workers'
weights and KV cache (`loom.worker.sleep_memory`), `wake_up` maps them again.

What happens to the requests a sleep finds is its mode (vLLM's PauseMode): "abort" ends
them (finish_reason abort), "wait" runs them to their end first, and "keep" holds them:
each resumes after wake-up, its KV cache recomputed where the sleep discarded it. Requests
added while asleep wait for the wake-up; none is dropped.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

TAGS = ("weights", "kv_cache")
MODES = ("abort", "wait", "keep")
LEVELS = {0: (), 1: TAGS, 2: TAGS}
"""vLLM's levels: 0 pauses scheduling only; 1 frees both, the weights backed up in host
memory; 2 frees both, the weights discarded (the model's non-parameter tensors kept)."""


def _check_tags(tags, what: str) -> set[str]:
    if not isinstance(tags, list | tuple) or not all(isinstance(t, str) for t in tags):
        raise ValueError(f"{what}.tags: must be a list of {', '.join(TAGS)}, got {tags!r}")
    bad = [t for t in tags if t not in TAGS]
    if bad:
        raise ValueError(f"{what}.tags: {bad[0]!r} is not a memory tag; known: "
                         f"{', '.join(TAGS)}")
    return set(tags)


class SleepMixin:
    """EngineCore's sleep methods; it keeps `_asleep` (the tags freed) and `_paused`."""

    _asleep: frozenset = frozenset()
    _paused = False

    def sleep(self, level: int = 1, mode: str = "abort", tags: list[str] | None = None) -> int:
        """Pause scheduling and free the level's (or tags') memory on every rank; returns
        the device bytes freed, summed over ranks."""
        if type(level) is not int or level not in LEVELS:
            raise ValueError(f"sleep.level: must be 0, 1 or 2, got {level!r}")
        if mode not in MODES:
            raise ValueError(f"sleep.mode: must be one of {', '.join(MODES)}, got {mode!r}")
        wanted = set(LEVELS[level]) if tags is None else _check_tags(tags, "sleep")
        if wanted and not self.config.model.enable_sleep_mode:
            raise ValueError("sleep: sleep mode is off; start the engine with "
                             "enable_sleep_mode=True (--enable-sleep-mode)")
        new = [t for t in TAGS if t in wanted and t not in self._asleep]
        self._settle(mode, discard_kv="kv_cache" in new)
        self._paused = True
        freed = 0
        if new:
            # explicit tags discard the weights (vLLM's); level 1 backs them up first
            freed = sum(self.collective_rpc("sleep", new, tags is None and level == 1))
            self._asleep = self._asleep | set(new)
        logger.info("sleep (level %d, %s): scheduling paused%s", level, mode,
                    f"; {', '.join(new)} freed ({freed / 2**30:.2f} GiB of device memory)"
                    if new else "")
        return freed

    def _settle(self, mode: str, discard_kv: bool) -> None:
        """The requests a sleep finds, as its mode says."""
        scheduler = self.scheduler
        if mode == "wait":
            self._paused = False
            done = []
            while self.has_unfinished_requests():
                done += self.step().outputs
            self._pending = done + self._pending
            return
        while self._in_flight:
            self._pending += self._collect_one()
        if mode == "abort":
            self._pending += scheduler.abort_requests(list(scheduler.requests))
        elif discard_kv:
            scheduler.preempt_running()
        if discard_kv and not scheduler.reset_prefix_cache():
            raise RuntimeError("sleep: the prefix cache could not be reset")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Map the tags' memory again (all that sleeps, by default); scheduling resumes
        once nothing sleeps."""
        wanted = set(TAGS) if tags is None else _check_tags(tags, "wake_up")
        waking = [t for t in TAGS if t in wanted and t in self._asleep]
        if waking:
            self.collective_rpc("wake_up", waking)
            self._asleep = self._asleep - set(waking)
        if not self._asleep:
            self._paused = False
        logger.info("wake_up: %s%s", ", ".join(waking) or "nothing was asleep",
                    "" if self._paused else "; scheduling resumed")

    def is_sleeping(self) -> bool:
        """True from a sleep until every tag it freed is awake again."""
        return self._paused
