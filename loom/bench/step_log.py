"""Where an offline run's time goes, step by step (`loom bench throughput --step-breakdown`).

The engine tells a `StepLog` of every step it launches (what the scheduler put in it) and
when the step's results are back. Under async scheduling the device runs the steps back to
back, so the time between two read-backs is the later step's device time (plus any host
time the device waited for); the first step's time runs from its launch. A read-back the
host collects late (its next launch blocked on a full launch queue: run_zzz142) moves the
next step's device time into it: the pair reads as ~2x and ~0, which `breakdown` names.
Where the worker runs in the engine's own process on CUDA (`Executor.local_device`), each
step is instead timed on the device: a CUDA event recorded behind its kernels, the time
from the event before (`CudaClock`), so no read-back moves time between steps; the times
between read-backs are kept beside them.
Steps are split into those with prompt tokens (prefill or mixed) and pure decode steps, and
each class is set against its own floor:

Every step gets the same floor, the sum of what its kernels must do one after another (a
step runs one kernel at a time):

- the linear layers: the longer of reading the weights once (the experts a batch of that
  many tokens is expected to touch, for MoE) at the copy rate and 2 x params x scheduled
  tokens at the matmul rate: a decode batch of a few hundred requests is compute-bound;
- the decodes' attention: every decoding request's KV cache (its whole context, K and V,
  every layer) at the copy rate: prompt steps carry hundreds of decodes too;
- the prompt chunks' causal attention over their context, at the matmul rate.

Floors divide by the TP size, as `loom.bench.floors` does. (Until session 10 decode steps
counted only the bytes, and prompt steps only the FLOPs, which made the two ratios look
further apart than the kernels are.)
"""

from __future__ import annotations

import gc
import statistics
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from loom.bench import floors
from loom.models.arch import ModelArch


@dataclass(frozen=True)
class Step:
    seconds: float
    prompt_tokens: int
    """Tokens of prompt chunks (requests scheduled for more than one token, drafts aside)."""
    decode_tokens: int
    """Tokens of decoding requests: one each, 1 + its drafts under speculative decoding."""
    decode_context: int
    """Sum of those requests' context lengths: the KV cache rows the step reads for them."""
    attention_pairs: int
    """(query, key) pairs of the prompt chunks' causal attention."""
    draft_tokens: int = 0
    """Speculative decoding: the drafts the step verified (0: a plain decode or prompt step)."""


READ_BACKS = "read-backs"
"""`StepLog.clock_name` without a device clock."""


class CudaClock:
    """Marks on the current CUDA stream, the one the engine's in-process worker launches
    every step's kernels and read-back on."""

    def __init__(self) -> None:
        import torch
        self._torch = torch

    def mark(self):
        event = self._torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, begin, end) -> float:
        return begin.elapsed_time(end) / 1e3

    def wait(self) -> None:
        self._torch.cuda.synchronize()


def device_clock(executor) -> CudaClock | None:
    """A clock on the device the executor's worker runs on in this process; None for
    worker processes (TP > 1: their streams are not this process's) and off CUDA."""
    device = executor.local_device
    return CudaClock() if device is not None and device.type == "cuda" else None


class StepLog:
    def __init__(self, clock=None) -> None:
        """clock: None to time each step between read-backs; a `CudaClock` (or anything
        with its mark/seconds/wait) to time it on the device."""
        self.clock = clock
        self._marks: list = []
        self.read_back_s: list[float] = []
        """Under a device clock, each step's time between read-backs (stop() replaces
        the steps' seconds with their device times)."""
        self.steps: list[Step] = []
        self._launched: deque[tuple[int, int, int, int, int]] = deque()
        self._last = self._start = time.perf_counter()
        self.first_launch_s: float | None = None
        """Seconds from start() to the first step's launch: the requests' intake."""
        self.gc_pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
        """Seconds of each garbage collection between start() and stop(), by generation."""
        self._gc_began: float | None = None
        self.gc_heaps: list[dict[str, Any]] = []
        """What the first two full collections found: objects per generation, and the
        most common types in generation 2."""

    @property
    def clock_name(self) -> str:
        return READ_BACKS if self.clock is None else "device events"

    def start(self) -> None:
        self.steps.clear()
        self._marks.clear()
        self.read_back_s = []
        self._launched.clear()
        self._last = self._start = time.perf_counter()
        self.first_launch_s = None
        self.gc_pauses = {0: [], 1: [], 2: []}
        self.gc_heaps = []
        self._gc_began = None
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self.clock is not None and self.steps and not self.read_back_s:
            # Steps are collected in launch order: step i ran from mark i to mark i + 1
            # (mark 0: before the first launch). A step launched but not collected has a
            # mark and no row.
            self.clock.wait()
            marks = self._marks
            self.read_back_s = [s.seconds for s in self.steps]
            self.steps = [replace(s, seconds=self.clock.seconds(marks[i], marks[i + 1]))
                          for i, s in enumerate(self.steps)]

    def _on_gc(self, phase: str, info: dict) -> None:
        """Python's collections in this process (the engine's, where it runs here): a
        full collection over a large heap stops every step behind it. The first two full
        ones also say what they walk (counted before the clock starts)."""
        if phase == "start":
            if info["generation"] == 2 and len(self.gc_heaps) < 2:
                self.gc_heaps.append(_heap_census())
            self._gc_began = time.perf_counter()
        elif self._gc_began is not None:
            self.gc_pauses[info["generation"]].append(time.perf_counter() - self._gc_began)
            self._gc_began = None

    def launched(self, scheduler_output, scheduler) -> None:
        if self.first_launch_s is None:
            # Step #1 is timed from its launch; the requests' intake before it is reported
            # apart (until session 57 it made step #1 look ~2.2x a median prompt step).
            self._last = time.perf_counter()
            self.first_launch_s = self._last - self._start
            if self.clock is not None:
                self._marks.append(self.clock.mark())
        prompt = decode = context = pairs = 0
        # Speculative decoding: a decode with drafts is a decode of 1 + drafts tokens.
        drafted = {c.req_id: len(c.spec_token_ids) for c in scheduler_output.cached_reqs
                   if c.spec_token_ids}
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            # The scheduler has already counted this step's tokens as computed.
            computed = scheduler.requests[req_id].num_computed_tokens
            if n == 1 + drafted.get(req_id, 0):
                decode += n
                context += computed
            else:
                prompt += n
                before = computed - n
                pairs += n * before + n * (n + 1) // 2
        self._launched.append((prompt, decode, context, pairs, sum(drafted.values())))

    def enqueued(self) -> None:
        """The step just launched has all its kernels queued: its end, on a device clock."""
        if self.clock is not None:
            self._marks.append(self.clock.mark())

    def collected(self) -> None:
        now = time.perf_counter()
        self.steps.append(Step(now - self._last, *self._launched.popleft()))
        self._last = now


def decode_step_times(steps: list[Step]) -> dict[str, dict[str, float]]:
    """Median, 10th and 90th percentile milliseconds of the steps without prompt tokens,
    by kind: "decode" (no drafts) and "verify" (drafts verified). Under async scheduling a
    plain decode runs ahead of its predecessor, so its time is its device time; nothing runs
    ahead of a verify step, so its time also holds the host work the device waited for."""
    kinds: dict[str, list[float]] = {}
    for step in steps:
        if not step.prompt_tokens:
            kinds.setdefault("verify" if step.draft_tokens else "decode", []).append(
                step.seconds * 1e3)
    return {kind: {"steps": len(ms), "median_ms": statistics.median(ms),
                   "p10_ms": float(np.percentile(ms, 10)), "p90_ms": float(np.percentile(ms, 90))}
            for kind, ms in sorted(kinds.items())}


def _heap_census(top: int = 8) -> dict[str, Any]:
    from collections import Counter
    old = gc.get_objects(generation=2)
    kinds = Counter(type(o).__qualname__ for o in old).most_common(top)
    return {"objects": [len(gc.get_objects(generation=g)) for g in (0, 1)] + [len(old)],
            "frozen": gc.get_freeze_count(), "gen2_types": kinds}


def step_floor_s(step: Step, arch: ModelArch, dtype_bytes: int, tp: int, ceilings,
                 kv_dtype_bytes: int | None = None) -> float:
    """The step's floor: linear layers (weights or FLOPs, whichever is longer), then the
    decodes' KV reads (kv_dtype_bytes an element; None: dtype_bytes), then the prompt
    chunks' attention FLOPs."""
    copy, matmul = ceilings.copy_tb_per_s * 1e12, ceilings.matmul_tflop_per_s * 1e12
    tokens = step.prompt_tokens + step.decode_tokens
    linear = max(floors.decode_bytes(arch, dtype_bytes, tokens) / copy,
                 2 * arch.num_params * tokens / matmul)
    kv_bytes_per_token = (2 * arch.num_layers * arch.num_kv_heads * arch.head_dim
                          * (kv_dtype_bytes or dtype_bytes))
    attention_flops_per_pair = 2 * 2 * arch.num_layers * arch.num_heads * arch.head_dim
    return (linear + step.decode_context * kv_bytes_per_token / copy
            + step.attention_pairs * attention_flops_per_pair / matmul) / tp


SLOWEST = 5
"""Steps of each class the breakdown names, slowest first."""
LATE = 0.5
"""A step timed under this share of its floor was read back late (see `breakdown`)."""

FLOOR_BASIS = ("per step: max(weights at the copy rate, linear FLOPs at the matmul rate) + "
               "decodes' KV at the copy rate + prompt attention FLOPs at the matmul rate")


def breakdown(log: StepLog, arch: ModelArch, dtype_bytes: int, tp: int,
              ceilings, kv_dtype_bytes: int | None = None) -> dict[str, Any]:
    """Totals and floors per class of step; the floors are None without ceilings (CPU).
    A step without tokens (it only tells the workers of finished requests) is in neither
    class: it runs no kernels, so it has no floor (session 59's device clock timed one at
    1 µs, against the 5 ms floor of reading the weights)."""
    out = {}
    numbered = [(i, s) for i, s in enumerate(log.steps, start=1)
                if s.prompt_tokens or s.decode_tokens]
    for name, of_class in (("decode_only", [p for p in numbered if p[1].prompt_tokens == 0]),
                           ("with_prompt", [p for p in numbered if p[1].prompt_tokens > 0])):
        steps = [s for _, s in of_class]
        seconds = sum(s.seconds for s in steps)
        decode = sum(s.decode_tokens for s in steps)
        # The slowest few, by number: a handful of long ones (a kernel compiled mid-run, a
        # host stall) and a class that is slow throughout read differently.
        slowest = sorted(of_class, key=lambda p: -p[1].seconds)[:SLOWEST]
        row = {"steps": len(steps), "seconds": seconds,
               "prompt_tokens": sum(s.prompt_tokens for s in steps), "decode_tokens": decode,
               "mean_decode_batch": decode / len(steps) if steps else 0.0,
               "median_step_s": statistics.median(s.seconds for s in steps) if steps else 0.0,
               "slowest_steps": [{"step": i, "seconds": s.seconds, "prompt_tokens": s.prompt_tokens,
                                  "decode_tokens": s.decode_tokens} for i, s in slowest],
               "floor_s": None, "ratio_to_floor": None}
        if ceilings is not None and steps:
            step_floors = [step_floor_s(s, arch, dtype_bytes, tp, ceilings, kv_dtype_bytes)
                           for s in steps]
            row["floor_s"] = sum(step_floors)
            row["floor_basis"] = FLOOR_BASIS
            row["ratio_to_floor"] = seconds / row["floor_s"]
            # No step runs in half its floor: one timed so was read back late, most of its
            # device time inside the time of the step before (run_zzz142: the host's launch
            # of the next step blocked on a full launch queue until that step's own end).
            late = sorted(((i, s, f) for (i, s), f in zip(of_class, step_floors)
                           if s.seconds < LATE * f), key=lambda x: x[1].seconds / x[2])
            row["late_steps"] = len(late)
            row["late_named"] = [{"step": i, "seconds": s.seconds, "floor_s": f}
                                 for i, s, f in late[:SLOWEST]]
        out[name] = row
    return out


def step_table(log: StepLog) -> list[list[float]]:
    """Every step as [seconds, prompt tokens, decode tokens], in launch order: what the
    breakdown's totals and extremes are made of; under a device clock, with the time
    between read-backs as a fourth column."""
    rows = [[s.seconds, s.prompt_tokens, s.decode_tokens] for s in log.steps]
    for row, read_back in zip(rows, log.read_back_s):
        row.append(read_back)
    return rows


def print_breakdown(rows: dict[str, Any], runtime_s: float, clock: str) -> None:
    print(f"Step breakdown (timed by {clock}):")
    for name, r in rows.items():
        line = (f"  {name.replace('_', ' ')}: {r['steps']} steps, {r['seconds']:.3f} s "
                f"({r['seconds'] / runtime_s:.0%} of the runtime), {r['prompt_tokens']} prompt "
                f"+ {r['decode_tokens']} decode tokens, mean decode batch "
                f"{r['mean_decode_batch']:.1f}")
        if r["floor_s"] is not None:
            line += f"; floor {r['floor_s']:.3f} s -> {r['ratio_to_floor']:.2f}x"
        print(line)
        if r["steps"]:
            slow = ", ".join(f"#{x['step']} {x['seconds'] * 1e3:.0f} ms" for x in r["slowest_steps"])
            print(f"    median step {r['median_step_s'] * 1e3:.1f} ms; slowest: {slow}")
        if r.get("late_steps"):
            fast = ", ".join(f"#{x['step']} {x['seconds'] * 1e3:.0f} ms (floor "
                             f"{x['floor_s'] * 1e3:.0f})" for x in r["late_named"])
            why = ("read back late: the step before holds their time" if clock == READ_BACKS
                   else "a device clock should time none so: check the floor")
            print(f"    {r['late_steps']} timed in under {LATE:.0%} of their floor ({why}): "
                  f"{fast}")
    floored = [r for r in rows.values() if r["floor_s"] is not None]
    if floored:
        total = sum(r["floor_s"] for r in floored)
        print(f"  steps' floors ({FLOOR_BASIS}): {total:.3f} s; runtime {runtime_s:.3f} s -> "
              f"{runtime_s / total:.2f}x")


def gc_report(log: StepLog) -> dict[str, Any]:
    """The run's collections by generation (count, seconds, longest), what the first full
    ones walked, and the thresholds the engine collected at."""
    report: dict[str, Any] = {
        f"gen{g}": {"collections": len(p), "seconds": sum(p), "longest_s": max(p, default=0.0)}
        for g, p in log.gc_pauses.items()}
    report["heaps"] = log.gc_heaps
    report["thresholds"] = list(gc.get_threshold())
    return report


def print_gc(report: dict[str, Any]) -> None:
    print("  Python GC in this process: " + ", ".join(
        f"gen{g} {report[f'gen{g}']['collections']} x, {report[f'gen{g}']['seconds'] * 1e3:.0f} "
        f"ms (longest {report[f'gen{g}']['longest_s'] * 1e3:.0f})" for g in (0, 1, 2)))
    for heap in report["heaps"]:
        print(f"    a full collection walked {heap['objects']} objects (gen0, 1, 2; "
              f"{heap['frozen']} frozen), gen2 mostly {heap['gen2_types'][:5]}")
