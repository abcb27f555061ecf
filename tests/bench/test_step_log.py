"""The engine's step log (`loom.bench.step_log`): what it records of each step, Python's
collections between start and stop, and `loom bench latency`'s verify steps timed apart from
plain decodes under speculative decoding."""

from __future__ import annotations

import json

import pytest

from tests.bench.cli_runs import latency_cli, throughput_cli


def test_step_log_times_the_collections_between_start_and_stop():
    import gc

    from loom.bench.step_log import StepLog
    kept = [[i] for i in range(5000)]  # long-lived lists: in generation 2 after this
    gc.collect()
    log = StepLog()
    log.start()
    gc.collect()  # a full collection: generation 2
    gc.collect(0)
    log.stop()
    gc.collect()  # after stop: not counted
    assert [len(log.gc_pauses[g]) for g in (0, 1, 2)] == [1, 0, 1]
    assert len(log.gc_heaps) == 1  # the full one says what it walked
    heap = log.gc_heaps[0]
    assert len(heap["objects"]) == 3 and heap["objects"][2] >= len(kept)
    assert dict(heap["gen2_types"])["list"] >= len(kept)
    assert all(p >= 0 for p in log.gc_pauses[2])
    assert log._on_gc not in gc.callbacks


def test_step_log_counts_a_verify_step_as_decodes():
    """Speculative decoding: a decode of 1 + drafts tokens is decoding, its context read once;
    only prompt chunks count as prompt tokens."""
    from types import SimpleNamespace

    from loom.bench.step_log import StepLog
    from loom.core.sched_output import CachedRequestData, SchedulerOutput
    out = SchedulerOutput(cached_reqs=[CachedRequestData("a", [], 40, [7, 8, 9]),
                                       CachedRequestData("b", [], 50),
                                       CachedRequestData("c", [], 0)],
                          num_scheduled_tokens={"a": 4, "b": 1, "c": 4})
    computed = {"a": 44, "b": 51, "c": 4}  # as the scheduler leaves them at launch
    scheduler = SimpleNamespace(requests={r: SimpleNamespace(num_computed_tokens=n)
                                          for r, n in computed.items()})
    log = StepLog()
    log.launched(out, scheduler)
    log.collected()
    step = log.steps[0]
    assert (step.prompt_tokens, step.decode_tokens, step.decode_context) == (4, 5, 44 + 51)
    assert step.draft_tokens == 3


def test_the_first_step_is_timed_from_its_launch_not_from_the_intake(monkeypatch):
    """Step #1's time is its own: the requests' intake before its launch is reported apart,
    and later steps run from the read-back before them."""
    from types import SimpleNamespace

    from loom.bench import step_log
    from loom.core.sched_output import SchedulerOutput
    clock = iter([100.0, 105.0, 107.5, 109.0])  # start, the first launch, two read-backs
    monkeypatch.setattr(step_log, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    out = SchedulerOutput(num_scheduled_tokens={"a": 8})
    scheduler = SimpleNamespace(requests={"a": SimpleNamespace(num_computed_tokens=8)})
    log = step_log.StepLog()  # starts its clock (start() would also watch the collector)
    log.launched(out, scheduler)
    log.launched(out, scheduler)
    log.collected()
    log.collected()
    assert log.first_launch_s == 5.0
    assert [s.seconds for s in log.steps] == [2.5, 1.5]


def test_decode_step_times_split_plain_decodes_from_verify_steps():
    from loom.bench.step_log import Step, decode_step_times
    steps = [Step(0.050, 8, 0, 0, 36),  # the prompt's: left out
             Step(0.005, 0, 1, 9, 0), Step(0.007, 0, 1, 10, 0), Step(0.006, 0, 1, 11, 0),
             Step(0.009, 0, 5, 12, 0, draft_tokens=4), Step(0.011, 0, 3, 17, 0, draft_tokens=2)]
    times = decode_step_times(steps)
    assert list(times) == ["decode", "verify"]
    assert times["decode"]["steps"] == 3 and times["decode"]["median_ms"] == pytest.approx(6.0)
    assert times["verify"]["steps"] == 2 and times["verify"]["median_ms"] == pytest.approx(10.0)
    assert times["decode"]["p10_ms"] == pytest.approx(5.2)  # 5 + 0.1 x (6 - 5) x 2
    assert decode_step_times(steps[:1]) == {}


def test_latency_times_verify_steps_apart_from_plain_decodes(tiny, tmp_path, capsys,
                                                            monkeypatch):
    """Greedy n-gram drafting at batch 1: the step log of the timed iteration holds one
    verify step for each step the scheduler counted as verified, and the steps account for
    every output token (the prompt step's one, a plain decode's one, a verify step's one
    more than the drafts it kept)."""
    out = tmp_path / "spec.json"
    spec = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2}'
    assert latency_cli(tiny, out, monkeypatch, "--output-len", "48", "--batch-size", "1",
                    "--num-iters-warmup", "0", "--num-iters", "1", "--temperature", "0",
                    "--speculative-config", spec) == 0
    assert "a step, median (p10-p90; timed iterations): decode " in capsys.readouterr().out
    r = json.loads(out.read_text())["speculative"]
    times = r["step_ms"]
    assert r["verified_steps"] > 0 and times["verify"]["steps"] == r["verified_steps"]
    assert 1 + times["decode"]["steps"] + r["verified_steps"] + r["accepted_tokens"] == 48
    assert all(t["p10_ms"] <= t["median_ms"] <= t["p90_ms"] for t in times.values())


def test_a_step_read_back_late_is_named_beside_the_slow_one_it_sits_in():
    """Four prompt steps of 16384 tokens on Llama-3.1-8B (~0.30 s of FLOPs each at 774
    TFLOP/s): the host stalls after #2's launch, so #2 is timed 0.6 s and #3, whose device
    time fell inside that stall, 2 ms. Only #3 is named late, and the table holds every step."""
    from loom.bench.ceilings import Ceilings
    from loom.bench.common import shipped_hf_config
    from loom.bench.step_log import Step, StepLog, breakdown, step_table
    from loom.models.arch import ModelArch
    arch = ModelArch.from_hf_config(shipped_hf_config("llama-3.1-8b"))
    log = StepLog()
    log.steps = [Step(seconds, 16384, 0, 0, 16 * 1024 * 1025 // 2)
                 for seconds in (0.31, 0.6, 0.002, 0.31)]
    h200 = Ceilings(device="H200", copy_tb_per_s=4.24, matmul_tflop_per_s=774.0)
    row = breakdown(log, arch, 2, 1, h200)["with_prompt"]
    assert row["late_steps"] == 1
    (late,) = row["late_named"]
    assert late["step"] == 3 and late["seconds"] == 0.002
    assert late["floor_s"] == pytest.approx(2 * 7.0e9 * 16384 / 774e12, rel=0.1)
    assert row["slowest_steps"][0]["step"] == 2
    assert step_table(log) == [[s, 16384, 0] for s in (0.31, 0.6, 0.002, 0.31)]


def test_a_step_without_tokens_is_in_no_class():
    """The last step of a run may only tell the workers of finished requests: no kernels,
    so no floor. Counted as a decode it would be named late against the weights' floor."""
    from loom.bench.ceilings import Ceilings
    from loom.bench.common import shipped_hf_config
    from loom.bench.step_log import Step, StepLog, breakdown, step_table
    from loom.models.arch import ModelArch
    arch = ModelArch.from_hf_config(shipped_hf_config("llama-3.1-8b"))
    log = StepLog()
    log.steps = [Step(0.03, 0, 300, 300 * 1100, 0), Step(1e-6, 0, 0, 0, 0)]
    h100 = Ceilings(device="H100", copy_tb_per_s=3.02, matmul_tflop_per_s=785.0)
    rows = breakdown(log, arch, 2, 1, h100)
    assert rows["decode_only"]["steps"] == 1 and rows["with_prompt"]["steps"] == 0
    assert rows["decode_only"]["late_steps"] == 0
    assert rows["decode_only"]["seconds"] == 0.03
    assert len(step_table(log)) == 2  # the table keeps every step


class _Clock:
    """A device clock whose marks are the numbers given, in order."""

    def __init__(self, marks) -> None:
        self._marks, self.waited = iter(marks), False

    def mark(self):
        return next(self._marks)

    def seconds(self, begin, end) -> float:
        assert self.waited  # a mark is read only after the device is done
        return end - begin

    def wait(self) -> None:
        self.waited = True


def test_a_device_clock_times_each_step_from_the_mark_before_it():
    """Marks: before the first launch, then behind each step's kernels. At stop() each
    collected step takes its device time; the time between read-backs is kept beside it,
    and a step launched but never collected adds no row."""
    from types import SimpleNamespace

    from loom.bench.step_log import StepLog, step_table
    from loom.core.sched_output import SchedulerOutput
    out = SchedulerOutput(num_scheduled_tokens={"a": 8})
    scheduler = SimpleNamespace(requests={"a": SimpleNamespace(num_computed_tokens=8)})
    log = StepLog(_Clock([10.0, 10.4, 10.5, 11.25]))
    assert log.clock_name == "device events"
    for _ in range(3):
        log.launched(out, scheduler)
        log.enqueued()
    log.collected()
    log.collected()
    wall = [s.seconds for s in log.steps]
    log.stop()
    assert [s.seconds for s in log.steps] == pytest.approx([0.4, 0.1])
    assert log.read_back_s == wall
    assert step_table(log) == [[pytest.approx(0.4), 8, 0, wall[0]],
                               [pytest.approx(0.1), 8, 0, wall[1]]]
    log.stop()  # a second stop changes nothing
    assert [s.seconds for s in log.steps] == pytest.approx([0.4, 0.1])


def test_throughput_marks_each_step_behind_its_launch(tiny, tmp_path, monkeypatch):
    """With a device clock (an in-process CUDA worker's; faked here on the CPU), the engine
    marks once before the first launch and once after each launch returns, so a step's
    device time runs from behind the kernels of the step before to behind its own."""
    from loom.bench import ceilings as ceilings_module
    from loom.bench import throughput
    from loom.executor.uniproc import UniprocExecutor
    from tests.bench.test_bench_offline import FAKE
    launches, marks = [], []
    real = UniprocExecutor.launch
    monkeypatch.setattr(UniprocExecutor, "launch",
                        lambda self, so: (launches.append(so), real(self, so))[1])

    class Counting(_Clock):
        def mark(self):
            marks.append(len(launches))
            return 0.5 * len(marks)  # every step 0.5 s on this clock

    seen = []
    monkeypatch.setattr(throughput, "device_clock",
                        lambda executor: (seen.append(executor.local_device), Counting(()))[1])
    monkeypatch.setattr(ceilings_module, "measure_ceilings", lambda device, **kw: FAKE)
    out = tmp_path / "throughput.json"
    assert throughput_cli(tiny, out, monkeypatch, "--max-num-batched-tokens", "16",
                          "--step-breakdown") == 0
    assert [d.type for d in seen] == ["cpu"]
    assert marks == list(range(len(marks))) and marks[-1] == len(launches)
    r = json.loads(out.read_text())
    assert r["step_clock"] == "device events"
    steps = r["steps"]
    assert len(steps) >= 6 * 8 // 16 + 3 and all(len(row) == 4 for row in steps)
    assert [row[0] for row in steps] == [0.5] * len(steps)
    rows = r["step_breakdown"]
    assert sum(row["seconds"] for row in rows.values()) == pytest.approx(0.5 * len(steps))
    assert sum(row[3] for row in steps) == pytest.approx(r["elapsed_time"], rel=0.2)


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_throughput_times_steps_on_cuda_events(tiny, tmp_path, monkeypatch):
    """On CUDA the worker runs in the engine's process, so steps are timed by CUDA events:
    each positive, and together no longer than the run (they span its first launch to the
    last step's end)."""
    from loom.bench import ceilings as ceilings_module
    from tests.bench.test_bench_offline import FAKE
    monkeypatch.setattr(ceilings_module, "measure_ceilings", lambda device, **kw: FAKE)
    out = tmp_path / "throughput.json"
    assert throughput_cli(tiny, out, monkeypatch, "--device", "cuda", "--input-len", "64",
                          "--output-len", "16", "--num-prompts", "32", "--max-model-len",
                          "128", "--step-breakdown") == 0
    r = json.loads(out.read_text())
    assert r["step_clock"] == "device events"
    device = [row[0] for row in r["steps"]]
    assert len(device) >= 15 and min(device) > 0
    assert 0.3 * r["elapsed_time"] < sum(device) <= r["elapsed_time"]
