"""Run a tiny model's forward at TP=2 on the CPU (two spawned processes, gloo), compiled at
level 3 with loom's real PiecewiseBackend and PassManager, and report what each pass left
in each compiled graph and how far the compiled outputs are from the eager TP=2 forward.

symm_mem's fused matmuls have no CPU kernel; for the async-TP check each rank registers
torch's own reference decomposition of them (all_gather/reduce_scatter + matmul, through
functional collectives on gloo) as the CPU kernel, so the rewritten graph runs end to end.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.multiprocessing as mp

WATCHED = ("loom.all_reduce.default", "loom.all_reduce_add_rms_norm.default",
           "loom.all_gather.default", "loom.reduce_scatter.default",
           "symm_mem.fused_all_gather_matmul.default",
           "symm_mem.fused_matmul_reduce_scatter.default",
           "loom.matmul_reduce_scatter_partials.default",
           "loom.all_gather_matmul.default", "loom.matmul_reduce_scatter.default",
           "loom.all_gather_matmul_p2p.default",
           "loom.matmul_reduce_scatter_partials_p2p.default")


@dataclass
class Scenario:
    path: str
    pass_config: dict
    compile_sizes: list[int] = field(default_factory=list)
    token_counts: tuple[int, ...] = (8, 14)
    env: dict = field(default_factory=dict)


def run_tp2(scenarios: list[Scenario], out_dir: str) -> list[dict]:
    """Rank 0's report for each scenario, run one after another in the same two processes
    (spawning them, importing torch and Inductor's first compile cost more than a scenario):
    [{"graphs": [{pass name: op counts after it}], "diffs": {n: rel}}]."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(scenarios, port, out_dir), nprocs=2, join=True)
    with open(os.path.join(out_dir, "rank0.json")) as f:
        return json.load(f)


def _worker(rank: int, scenarios: list[Scenario], port: int, out_dir: str) -> None:
    from loom.distributed.parallel_state import destroy_distributed, init_distributed
    init_distributed(2, rank, f"tcp://127.0.0.1:{port}", "gloo")
    _register_cpu_fused_ops()
    reports = []
    try:
        for scenario in scenarios:
            saved = {k: os.environ.get(k) for k in scenario.env}
            os.environ.update(scenario.env)
            try:
                reports.append(_compile_and_compare(scenario))
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
                torch._dynamo.reset()  # no scenario's guards or cache-size count reach the next
    finally:
        destroy_distributed()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(reports, f)
    # The reports are on disk: leave without the interpreter's teardown. Once, in a clean-clone
    # CI run, a rank died with SIGABRT ("terminate called without an active exception": a
    # C++ thread still joinable when its owner was destroyed) and no Python error, most
    # likely in that teardown; it did not recur in nine runs of the test alone.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _compile_and_compare(scenario: Scenario) -> dict:
    from loom.attention.torch_native import TorchNativeBackend
    from loom.compilation import backend
    from loom.config import CompilationConfig, EngineConfig, ModelConfig, ParallelConfig
    from loom.forward_context import ForwardContext, forward_context
    from loom.worker.model_loader import load_model
    config = EngineConfig(model=ModelConfig(scenario.path, dtype="float32"),
                          parallel=ParallelConfig(2))
    model, _, _ = load_model(config, torch.device("cpu"))
    compilation = CompilationConfig(level=3, compile_sizes=tuple(scenario.compile_sizes),
                                    pass_config=scenario.pass_config)
    graphs: list[dict] = []
    compiled = backend.CompiledForward(model, compilation, enforce_eager=False, tp_size=2)
    _record_passes(compiled, graphs)
    diffs = {}
    torch.manual_seed(0)
    for n in scenario.token_counts:
        ids, positions = torch.randint(0, 256, (n,)), torch.arange(n)
        with torch.no_grad(), forward_context(ForwardContext(None, [], TorchNativeBackend())):
            expected = model(ids, positions)
            actual = compiled(ids, positions)
        diffs[n] = ((actual - expected).abs().max() / expected.abs().max()).item()
    return {"graphs": graphs, "diffs": diffs}


class _Recorder:
    """Wraps one pass: after it runs, counts the watched ops left in the graph."""

    def __init__(self, inner, graphs: list[dict], first: bool) -> None:
        self.inner, self.graphs, self.first = inner, graphs, first
        self.name = inner.name

    def __call__(self, graph) -> None:
        if self.first:
            self.graphs.append({})
        self.inner(graph)
        graph.lint()  # every pass leaves a well-formed, topologically ordered graph
        ops = Counter(str(n.target) for n in graph.nodes if n.op == "call_function")
        self.graphs[-1][self.name] = {op: ops.get(op, 0) for op in WATCHED}


def _record_passes(compiled, graphs: list[dict]) -> None:
    # Cached graphs skip the passes: every graph must really compile here.
    torch._inductor.config.fx_graph_cache = False
    torch._functorch.config.enable_autograd_cache = False
    manager = compiled.pass_manager
    manager.passes = [_Recorder(p, graphs, i == 0) for i, p in enumerate(manager.passes)]


def _register_cpu_fused_ops() -> None:
    from torch.distributed import _symmetric_memory as symm_mem
    for name, fn in (("fused_all_gather_matmul", symm_mem._fused_all_gather_matmul_fallback),
                     ("fused_matmul_reduce_scatter",
                      symm_mem._fused_matmul_reduce_scatter_fallback)):
        torch.library.impl(f"symm_mem::{name}", "CPU")(fn)
