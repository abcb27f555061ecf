"""`loom bench latency` and `loom bench throughput` on a tiny model on the CPU; the shipped
configs and the floors they imply."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loom import envs
from loom.bench import ceilings as ceilings_module
from loom.bench import floors
from loom.bench.ceilings import Ceilings
from loom.cli import main
from loom.config import CompilationConfig
from loom.models.arch import ModelArch
from tests.bench.cli_runs import latency_cli, throughput_cli

AVG = re.compile(r"^Avg latency: ([0-9.e+-]+) seconds$", re.M)
PCT = re.compile(r"^(\d+)% percentile latency: ([0-9.e+-]+) seconds$", re.M)
THROUGHPUT = re.compile(r"^Throughput: ([0-9.]+) requests/s, ([0-9.]+) total tokens/s, "
                        r"([0-9.]+) output tokens/s$", re.M)
FAKE = Ceilings(device="fake", copy_tb_per_s=1e-3, matmul_tflop_per_s=1e-3)


def load_script(name: str):
    """A script of benchmarks/gpu/ (not a package) as a module; its folder is on sys.path
    while it loads, as when it runs, for the siblings it imports."""
    import importlib.util
    folder = str(Path(__file__).parents[2] / "benchmarks/gpu")
    spec = importlib.util.spec_from_file_location(name, f"{folder}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def test_latency_prints_like_the_seed_and_writes_json(tiny, tmp_path, capsys, monkeypatch):
    out = tmp_path / "latency.json"
    assert latency_cli(tiny, out, monkeypatch, "--output-len", "4", "--decode-split") == 0
    text = capsys.readouterr().out
    avg = float(AVG.search(text).group(1))
    printed = {int(p): float(v) for p, v in PCT.findall(text)}
    assert list(printed) == [10, 25, 50, 75, 90, 99]
    assert "Ceilings: skipped" in text and "ms/token (split" in text

    result = json.loads(out.read_text())
    assert {"device", "git_commit", "command", "engine_args", "ceilings", "latencies",
            "avg_latency", "percentiles", "decode_split", "floors"} <= set(result)
    assert result["device"] == "cpu" and result["ceilings"] is None
    assert result["command"].startswith("loom bench latency --model")
    assert result["engine_args"]["model"] == tiny and result["engine_args"]["device"] == "cpu"
    assert result["compilation_level"] == 0  # no -O on the CPU
    assert len(result["latencies"]) == 2 and result["avg_latency"] == pytest.approx(avg)
    assert result["avg_latency"] == pytest.approx(np.mean(result["latencies"]))
    assert result["percentiles"]["90"] == pytest.approx(np.percentile(result["latencies"], 90))
    split = result["decode_split"]
    assert split["output_len"] == 1 and len(split["latencies"]) == 2
    ms = (result["avg_latency"] - split["avg_latency"]) / 3 * 1e3
    assert result["floors"]["decode_ms_per_token"] == pytest.approx(ms)
    assert result["floors"]["decode_floor_ms_per_token"] is None


def test_tp_prefill_prints_all_reduce_time_and_target(tiny, tmp_path, capsys, monkeypatch):
    single = tmp_path / "tp1.json"
    assert latency_cli(tiny, single, monkeypatch, "--output-len", "1") == 0
    out = tmp_path / "tp2.json"
    assert latency_cli(tiny, out, monkeypatch, "--output-len", "1", "-tp", "2",
                    "--reference-json", str(single)) == 0
    text = capsys.readouterr().out
    assert re.search(r"^All-reduce: 5 x [0-9.]+ us = [0-9.]+ ms per forward; target 1-GPU", text,
                     re.M)  # two layers: embedding + 2 per layer
    floors_ = json.loads(out.read_text())["floors"]
    reference = json.loads(single.read_text())["avg_latency"]
    assert floors_["all_reduce_s"] > 0 and floors_["reference_latency_s"] == reference
    target = reference / 2 + 5 * floors_["all_reduce_s"]
    assert floors_["tp_target_s"] == pytest.approx(target)
    assert floors_["tp_ratio_to_target"] == pytest.approx(
        json.loads(out.read_text())["avg_latency"] / target)


@pytest.mark.parametrize("tp", [1, 2])
def test_profile_writes_every_ranks_trace_and_prints_ops(tiny, tmp_path, capsys, monkeypatch, tp):
    profile_dir = tmp_path / "prof"
    out = tmp_path / "l.json"
    if tp == 1:  # and its Python frames, as vLLM's VLLM_TORCH_PROFILER_WITH_STACK
        monkeypatch.setenv("LOOM_TORCH_PROFILER_WITH_STACK", "1")
    assert latency_cli(tiny, out, monkeypatch, "--output-len", "3", "-tp", str(tp),
                    "--profile", "--profile-result-dir", str(profile_dir)) == 0
    text = capsys.readouterr().out
    assert "Profile of one iteration" in text and "aten::" in text
    if tp == 2:  # a TP decode also times its step's all-reduces (one run serves both checks)
        assert re.search(r"^All-reduce \(decode step, in a CUDA graph on GPU\): 5 x [0-9.]+ us "
                         r"= [0-9.]+ ms per step$", text, re.M)
        floors_ = json.loads(out.read_text())["floors"]
        assert floors_["decode_all_reduce_s"] > 0
        assert floors_["decode_all_reduce_step_s"] == pytest.approx(
            5 * floors_["decode_all_reduce_s"])
    for rank in range(tp):
        trace = json.loads((profile_dir / f"trace-rank{rank}.json").read_text())
        assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
        assert "Self CPU" in (profile_dir / f"ops-rank{rank}.txt").read_text()
        frames = [e for e in trace["traceEvents"] if e.get("cat") == "python_function"]
        assert bool(frames) == (tp == 1)
    if tp == 1:  # trace_gaps sums a (here made-up) idle span by the loom frames then running
        trace_gaps = load_script("trace_gaps")
        step = max(frames, key=lambda e: e["dur"] * ("model_runner.py" in e["name"]))
        idle = trace_gaps.idle_by_frames(str(profile_dir / "trace-rank0.json"),
                                         [(step["dur"], step["ts"], None, None)])
        assert idle and any("worker/model_runner.py" in name for _, name in idle)
        assert sum(ms for ms, _ in idle) == pytest.approx(step["dur"] / 1e3, abs=0.02)


def test_host_profile_names_the_model_runner_on_every_rank(tiny, tmp_path, capsys, monkeypatch):
    profile_dir = tmp_path / "prof"
    assert latency_cli(tiny, tmp_path / "l.json", monkeypatch, "--output-len", "2", "-tp", "2",
                    "--profile-host", "--profile-result-dir", str(profile_dir)) == 0
    assert "host functions" in capsys.readouterr().out
    for rank in range(2):
        text = (profile_dir / f"host-rank{rank}.txt").read_text()
        assert "sorted by tottime" in text and "sorted by cumulative" in text
        assert "model_runner.py" in text  # the step's own code, profiled in the worker


def test_latency_floor_ratios_from_the_ceilings(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ceilings_module, "measure_ceilings", lambda device, **kw: FAKE)
    out = tmp_path / "prefill.json"
    assert latency_cli(tiny, out, monkeypatch, "--output-len", "1") == 0
    assert "of the matmul ceiling" in capsys.readouterr().out
    r = json.loads(out.read_text())
    arch = ModelArch.from_hf_config(json.loads(open(f"{tiny}/config.json").read()))
    flops = floors.prefill_flops(arch, 8, 2)
    assert r["floors"]["prefill_flops"] == pytest.approx(flops)
    assert r["floors"]["prefill_floor_s"] == pytest.approx(flops / 1e9)
    assert r["floors"]["prefill_fraction_of_ceiling"] == pytest.approx(
        r["floors"]["prefill_floor_s"] / r["avg_latency"])
    assert r["ceilings"]["copy_tb_per_s"] == 1e-3

    assert latency_cli(tiny, out, monkeypatch, "--output-len", "3") == 0
    r = json.loads(out.read_text())["floors"]
    assert r["decode_ms_per_token_method"].startswith("whole request")
    floor_ms = floors.decode_bytes(arch, 4, 2) / 1e9 * 1e3  # float32 on CPU, at 1 GB/s
    assert r["decode_floor_ms_per_token"] == pytest.approx(floor_ms)
    assert r["decode_ratio_to_floor"] == pytest.approx(r["decode_ms_per_token"] / floor_ms)


def _throughput(tiny: str, out_json, monkeypatch, ceilings: Ceilings) -> int:
    """6 prompts of 8 tokens -> 4 outputs, judged by the given ceilings."""
    monkeypatch.setattr(ceilings_module, "measure_ceilings", lambda device, **kw: ceilings)
    return throughput_cli(tiny, out_json, monkeypatch)


def test_throughput_prints_and_writes_json(tiny, tmp_path, capsys, monkeypatch):
    out = tmp_path / "throughput.json"
    assert _throughput(tiny, out, monkeypatch, FAKE) == 0
    text = capsys.readouterr().out
    req_s, tok_s, out_s = map(float, THROUGHPUT.search(text).groups())
    assert tok_s == pytest.approx(req_s * 12, rel=1e-3)
    assert out_s == pytest.approx(req_s * 4, rel=1e-3)
    assert "Compute floor:" in text
    r = json.loads(out.read_text())
    assert r["num_requests"] == 6 and r["prompt_tokens"] == 48 and r["output_tokens"] == 24
    assert r["requests_per_second"] == pytest.approx(6 / r["elapsed_time"])
    assert r["runtime_ratio_to_floor"] == pytest.approx(r["elapsed_time"] / r["floor_s"])
    assert {"device", "git_commit", "command", "engine_args", "ceilings"} <= set(r)
    assert r["floor_held_s"] is None  # FAKE has no held rate
    assert r["cuda_allocator"] is None and "CUDA allocator" not in text  # no CUDA here


def test_allocator_report_counts_what_the_run_did(capsys):
    from loom.bench.throughput import allocator_delta, print_allocator
    from loom.worker.worker import Worker
    before = dict.fromkeys(Worker.ALLOCATOR_COUNTERS, 0) | {
        "num_device_alloc": 40, "num_device_free": 2, "reserved_bytes.all.current": 3 << 30}
    after = before | {"num_device_alloc": 47, "num_device_free": 5, "num_alloc_retries": 1,
                      "reserved_bytes.all.current": 5 << 30}
    d = allocator_delta(before, after)
    assert d == {"num_device_alloc": 7, "num_device_free": 3, "num_alloc_retries": 1,
                 "num_ooms": 0, "reserved_bytes.all.current": 5 << 30}
    print_allocator(d)
    assert "7 device allocations, 3 frees, 1 retries after freeing its cache, 0 out of " \
        "memory; 5.00 GiB held at the end" in capsys.readouterr().out


def test_floors_at_the_held_matmul_rate(tiny, tmp_path, capsys, monkeypatch):
    # The matmul held at 3/4 of its burst rate: every compute floor is 4/3 as long.
    held = dataclasses.replace(FAKE, matmul_held_tflop_per_s=0.75e-3, matmul_held_s=3.0)
    out = tmp_path / "throughput.json"
    assert _throughput(tiny, out, monkeypatch, held) == 0
    text = capsys.readouterr().out
    assert "held 3 s: 0.0 TFLOP/s (75% of it)" in text
    assert "Compute floor at the held matmul rate:" in text
    r = json.loads(out.read_text())
    assert r["floor_held_s"] == pytest.approx(r["floor_s"] * 4 / 3)
    assert r["runtime_ratio_to_held_floor"] == pytest.approx(r["elapsed_time"] / r["floor_held_s"])
    out = tmp_path / "prefill.json"
    assert latency_cli(tiny, out, monkeypatch, "--output-len", "1") == 0
    assert "of its held rate)" in capsys.readouterr().out
    f = json.loads(out.read_text())["floors"]
    assert f["prefill_fraction_of_held_ceiling"] == pytest.approx(
        f["prefill_fraction_of_ceiling"] * 4 / 3)


def test_throughput_step_breakdown_accounts_for_every_token_and_step(tiny, tmp_path, capsys,
                                                                     monkeypatch):
    """6 prompts of 8 tokens -> 4 outputs, in chunks of at most 16 batched tokens: every
    prompt token is in a prompt-carrying step, every output after the first is one decode
    token, and the steps' times add up to the run."""
    monkeypatch.setattr(ceilings_module, "measure_ceilings", lambda device, **kw: FAKE)
    out = tmp_path / "throughput.json"
    assert throughput_cli(tiny, out, monkeypatch, "--max-num-batched-tokens", "16",
                          "--step-breakdown") == 0
    assert "Step breakdown" in capsys.readouterr().out
    r = json.loads(out.read_text())
    rows = r["step_breakdown"]
    decode, mixed = rows["decode_only"], rows["with_prompt"]
    assert decode["prompt_tokens"] == 0 and mixed["prompt_tokens"] == 6 * 8
    assert r["prompt_tokens_computed"] == 6 * 8  # no preemption, random prompts: no hits
    assert decode["decode_tokens"] + mixed["decode_tokens"] == 6 * (4 - 1)
    assert mixed["steps"] >= 6 * 8 // 16 and decode["steps"] >= 4 - 1
    assert decode["seconds"] + mixed["seconds"] == pytest.approx(r["elapsed_time"], rel=0.2)
    for row in (decode, mixed):
        assert row["ratio_to_floor"] == pytest.approx(row["seconds"] / row["floor_s"])
        slow = row["slowest_steps"]
        assert 1 <= len(slow) <= 5 and [x["seconds"] for x in slow] == sorted(
            (x["seconds"] for x in slow), reverse=True)
        assert slow[0]["seconds"] >= row["median_step_s"] > 0
    # step numbers count all steps from 1; each named step is of its own class
    assert all(x["prompt_tokens"] == 0 for x in decode["slowest_steps"])
    assert all(x["prompt_tokens"] > 0 for x in mixed["slowest_steps"])
    assert 0 < r["first_step_launched_s"] < r["elapsed_time"]
    table = r["steps"]  # every step, in order: the rows are made of the ones with tokens
    run = [t for t in table if t[1] or t[2]]
    assert len(run) == decode["steps"] + mixed["steps"]
    assert sum(t[1] for t in table) == 6 * 8 and sum(t[0] for t in run) == pytest.approx(
        decode["seconds"] + mixed["seconds"])
    assert all(x["seconds"] < 0.5 * x["floor_s"] for x in mixed.get("late_named", []))
    gc_rows = r["gc"]
    assert set(gc_rows) == {"gen0", "gen1", "gen2", "heaps", "thresholds"}
    assert tuple(gc_rows["thresholds"]) == envs.GC_THRESHOLDS  # the engine set them
    assert all(gc_rows[g]["seconds"] >= gc_rows[g]["longest_s"] >= 0
               for g in ("gen0", "gen1", "gen2"))
    numbers = [x["step"] for row in (decode, mixed) for x in row["slowest_steps"]]
    assert len(set(numbers)) == len(numbers) and 1 <= min(numbers)
    assert max(numbers) <= decode["steps"] + mixed["steps"]


def test_bad_arguments_are_cli_errors(tiny, capsys):
    assert main(["bench", "latency", "--model", tiny, "--output-len", "1", "--decode-split"]) == 2
    assert "decode_split" in capsys.readouterr().err
    assert main(["bench", "throughput", "--model", tiny, "--num-prompts", "0"]) == 2
    # Refused before the engine is built (these were found out after the whole run).
    assert main(["bench", "latency", "--model", tiny, "--device", "cpu", "--max-model-len", "64",
                 "--input-len", "60", "--output-len", "10"]) == 2
    assert "max_model_len (64)" in capsys.readouterr().err
    assert main(["bench", "latency", "--model", tiny, "--device", "cpu", "--max-model-len", "64",
                 "--input-len", "8", "--output-len", "1", "--reference-json", "/no/such.json"]) == 2
    assert "reference_json" in capsys.readouterr().err


def test_building_the_cli_does_not_import_torch():
    code = "import sys, loom.cli; loom.cli.build_parser(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_latency_captures_only_the_graph_it_replays(capsys):
    from argparse import Namespace

    import torch

    from loom.bench.latency import only_the_replayed_graph

    def sizes(compilation, batch=4, output_len=8, eager=False, device="cpu", input_len=16,
              spec=None):
        args = Namespace(compilation_config=compilation, batch_size=batch, input_len=input_len,
                         output_len=output_len, enforce_eager=eager, device=device,
                         speculative_config=spec)
        config = CompilationConfig.parse(only_the_replayed_graph(args))
        return config.cudagraph_capture_sizes

    assert sizes('{"level":3}') == (4,)
    assert sizes('{"level":3,"compile_sizes":[8192]}', batch=1, output_len=1) == ()
    assert sizes('{"level":3,"cudagraph_capture_sizes":[1,2]}') == (1, 2)  # the user's
    assert sizes('{"level":3,"cudagraph_mode":"PIECEWISE"}') is None  # sizes of its pieces
    assert sizes("3", eager=True) is None and sizes(None) is None  # unset: 0 on the CPU
    if torch.cuda.is_available():
        assert sizes(None, device="cuda") == (4,)  # unset: 3 on CUDA
    assert "capturing batch sizes 4 only" in capsys.readouterr().out
    # Speculative decoding's verify steps, k + 1 tokens a request: FULL_AND_PIECEWISE
    # sizes their graphs from the decode batch; FULL needs their size among its own
    spec = '{"method": "ngram", "num_speculative_tokens": 4}'
    assert sizes('{"level":3}', spec=spec) == (4,)
    assert sizes('{"level":3,"cudagraph_mode":"FULL"}', spec=spec) == (4, 20, 64)
    capsys.readouterr()
    # FULL: the prompt step's tokens too, so that its mixed graph exists (up to 512)
    full = '{"level":3,"cudagraph_mode":"FULL"}'
    assert sizes(full) == (4, 64)
    assert "capturing batch size 4 and the prompt step's 64 tokens" in capsys.readouterr().out
    assert sizes(full, batch=1, output_len=1, input_len=128) == (128,)
    assert "capturing the prompt step's 128 tokens (cudagraph_mode FULL)" in \
        capsys.readouterr().out
    assert sizes(full, input_len=200) == (4,)  # 800 tokens: no graph


def test_throughput_profiles_the_steps_asked_for_on_every_rank(tiny, tmp_path, capsys,
                                                              monkeypatch):
    """Steps 2-4 of a TP=2 run, profiled by the workers themselves: what each rank says the
    steps held matches what the engine launched (its step log), and each rank's trace holds
    ops."""
    from loom.bench import step_log
    launched, real = [], step_log.StepLog.launched

    def record(self, scheduler_output, scheduler):
        real(self, scheduler_output, scheduler)
        launched.append(self._launched[-1][:2])  # (prompt tokens, decodes)
    monkeypatch.setattr(step_log.StepLog, "launched", record)
    out, profile_dir = tmp_path / "throughput.json", tmp_path / "prof"
    assert throughput_cli(tiny, out, monkeypatch, "--max-num-batched-tokens", "16", "-tp", "2",
                          "--step-breakdown", "--profile-steps", "2", "3",
                          "--profile-result-dir", str(profile_dir)) == 0
    text = capsys.readouterr().out
    assert re.search(r"^Profile of steps 2-4 \(\d+ prompt tokens, \d+ decodes", text, re.M)
    assert "aten::" in text
    steps = json.loads(out.read_text())["profiled_steps"]
    assert [(s["prompt_tokens"], s["decodes"]) for s in steps] == launched[1:4]
    assert steps[0]["prompt_tokens"] > 0  # 48 prompt tokens at 16 a step: still prefilling
    step_trace = load_script("step_trace")
    for rank in range(2):
        trace = json.loads((profile_dir / f"trace-rank{rank}.json").read_text())
        assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
        # each step's launch is named in the trace, with what the engine launched in it
        named = step_trace.steps_of(str(profile_dir / f"trace-rank{rank}.json"))
        assert [s["label"] for s in named] == [
            f"loom step {i}: {p} prompt tokens + {d} decodes"
            for i, (p, d) in enumerate(launched[1:4], start=2)]
        assert all(s["host_ms"] > 0 for s in named)


def test_throughput_profile_past_the_last_step_says_so(tiny, tmp_path, capsys, monkeypatch):
    argv = ["bench", "throughput", "--model", tiny, "--device", "cpu", "--input-len", "8",
            "--output-len", "2", "--num-prompts", "2", "--max-model-len", "64",
            "--profile-steps", "1000", "1", "--profile-result-dir", str(tmp_path / "p")]
    monkeypatch.setattr(sys, "argv", ["loom", *argv])
    assert main(argv) == 0
    assert "the run had fewer than 1000 steps; nothing was profiled" in capsys.readouterr().out
    assert main(["bench", "throughput", "--model", tiny, "--profile-steps", "0", "1"]) == 2
    assert "profile_steps: must be at least 1" in capsys.readouterr().err


def test_throughput_with_dummy_lora_adapters(tiny, tmp_path, capsys, monkeypatch):
    """--lora-path dummy: a random adapter for the model, under each of --max-loras ids."""
    from loom.lora.manager import LoRAManager
    seen, prepare = set(), LoRAManager.prepare
    monkeypatch.setattr(LoRAManager, "prepare", lambda self, loras, *a: (
        seen.update(lo.lora_int_id for lo in loras if lo is not None),
        prepare(self, loras, *a))[1])
    monkeypatch.setattr(ceilings_module, "measure_ceilings", lambda device, **kw: FAKE)
    argv = ["bench", "throughput", "--model", tiny, "--device", "cpu", "--input-len", "8",
            "--output-len", "4", "--num-prompts", "6", "--max-model-len", "64",
            "--enable-lora", "--max-loras", "2", "--max-lora-rank", "4", "--lora-path", "dummy",
            "--output-json", str(tmp_path / "t.json")]
    assert main(argv) == 0
    assert seen == {1, 2} and THROUGHPUT.search(capsys.readouterr().out)
    assert main(argv[:12] + ["--lora-path", "dummy"]) == 2
    assert "lora_path: needs --enable-lora" in capsys.readouterr().err
