"""benchmarks/gpu/step_trace.py on a made-up CUDA trace: kernels belong to the step whose
annotation holds their launch, whenever they run on the device."""

from __future__ import annotations

import json

from tests.bench.test_bench_offline import load_script


def _event(cat: str, name: str, ts: int, dur: int, correlation: int | None = None) -> dict:
    args = {} if correlation is None else {"args": {"correlation": correlation}}
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **args}


def _trace(tmp_path) -> str:
    launch = "cudaLaunchKernel"
    events = [
        # two steps' launches on the host (us); step 2 is launched while step 1 runs
        _event("user_annotation", "loom step 1: 16 prompt tokens + 0 decodes", 0, 300),
        _event("user_annotation", "loom step 2: 8 prompt tokens + 2 decodes", 400, 100),
        _event("cuda_runtime", launch, 10, 5, 1),
        _event("cuda_runtime", "cudaMalloc", 20, 260, 2),
        _event("cuda_runtime", launch, 280, 5, 3),
        _event("cuda_runtime", launch, 410, 5, 4),
        _event("cuda_driver", "cuLaunchKernelEx", 420, 5, 6),  # a Triton kernel's launch
        _event("cuda_runtime", launch, 600, 5, 5),  # outside every step: not counted
        # the device: step 1's kernels, then step 2's after them
        _event("kernel", "gemm", 100, 200, 1),
        _event("kernel", "attention", 350, 150, 3),  # runs during step 2's launch
        _event("kernel", "gemm", 500, 400, 4),
        _event("kernel", "gemm", 900, 50, 5),
        _event("kernel", "triton_attn", 950, 30, 6),
    ]
    path = tmp_path / "trace-rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


def test_each_step_owns_the_kernels_it_launched(tmp_path, capsys):
    step_trace = load_script("step_trace")
    one, two = step_trace.steps_of(_trace(tmp_path))
    assert one["label"].startswith("loom step 1:") and two["label"].startswith("loom step 2:")
    assert (one["host_ms"], two["host_ms"]) == (0.3, 0.1)
    assert one["runtime"] == {"cudaLaunchKernel": 0.01, "cudaMalloc": 0.26}
    assert dict(one["kernels"]) == {"gemm": 0.2, "attention": 0.15}
    assert one["launches"] == 2 and one["device_ms"] == 0.35
    assert one["span_ms"] == 0.4 and one["device_start_ms"] == 0.1  # 100 .. 500 us
    assert dict(two["kernels"]) == {"gemm": 0.4, "triton_attn": 0.03}
    assert two["device_start_ms"] == 0.5 and two["runtime"]["cuLaunchKernelEx"] == 0.005
    assert two["host_start_ms"] == 0.4
    step_trace.report([one, two], top=5)
    table = capsys.readouterr().out
    assert "runtime calls: cudaMalloc 0.3 ms, cudaLaunchKernel 0.0 ms" in table
    rows = {line.split()[-1]: line.split()[:2] for line in table.splitlines()
            if line.strip().endswith(("gemm", "attention", "triton_attn"))}
    assert rows == {"gemm": ["0.20", "0.40"], "attention": ["0.15", "0.00"],
                    "triton_attn": ["0.00", "0.03"]}
