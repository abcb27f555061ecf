"""A worker: one rank's device, process group and model runner."""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from loom import envs
from loom.config import EngineConfig
from loom.core.sched_output import SchedulerOutput
from loom.distributed.ops import tp_all_reduce
from loom.distributed.parallel_state import init_distributed
from loom.worker.device_setup import resolved_for_device
from loom.worker.model_runner import ModelRunner
from loom.worker.step_handle import StepHandle


def resolve_device(requested: str, rank: int = 0) -> torch.device:
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was requested but no CUDA device is available")
    return torch.device("cuda", rank % torch.cuda.device_count())


class Worker:
    def __init__(self, config: EngineConfig, rank: int = 0,
                 distributed_init_method: str | None = None) -> None:
        self.rank = rank
        self.extension_methods: frozenset[str] = frozenset()
        """worker_extension_cls's methods, callable by name as PUBLIC_METHODS are."""
        if config.parallel.worker_extension_cls:
            from loom.worker.extension import extend
            self.extension_methods = extend(self, config.parallel.worker_extension_cls)
        self.device = resolve_device(config.device.device, rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.config = config = resolved_for_device(config, self.device)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        init_distributed(config.parallel.tensor_parallel_size, rank, distributed_init_method, backend)
        # Unseeded requests draw from the global generator; seed it so runs repeat.
        torch.manual_seed(config.model.seed)
        self.model_runner = ModelRunner(config, self.device, is_driver=rank == 0)
        self._step_window: _StepWindow | None = None

    RPC_METHODS = frozenset({"determine_num_blocks", "initialize_cache", "model_info", "get_env",
                             "time_all_reduce", "profile", "profile_steps",
                             "profile_steps_result", "allocator_stats", "sleep", "wake_up",
                             "call_function"})
    PUBLIC_METHODS = frozenset({"reload_weights", "update_weights", "model_info",
                                "allocator_stats"})
    """What `LLM.collective_rpc` and the server's /collective_rpc may call by name. Not
    sleep and wake_up: the engine must know what sleeps (LLM.sleep, /sleep)."""

    def rpc(self, method: str, args: list):
        """A call from the executor by name; only the methods listed are reachable."""
        if method not in self.RPC_METHODS:
            raise ValueError(f"worker rpc: unknown method {method!r}")
        return getattr(self, method)(*args)

    # Sleep mode and weight updates (vLLM's) -------------------------------------------
    def _sleep_memory(self):
        memory = self.model_runner.sleep_memory
        if memory is None:
            raise ValueError("sleep mode is off: start the engine with enable_sleep_mode=True "
                             "(--enable-sleep-mode)")
        return memory

    def _device_free(self) -> int:
        return torch.cuda.mem_get_info(self.device)[0] if self.device.type == "cuda" else 0

    def sleep(self, tags: list[str], offload_weights: bool = True) -> int:
        """Free the tags' memory (weights: backed up in host memory first with
        offload_weights, else discarded but for non-parameter tensors); returns the device
        bytes freed (0 on the CPU)."""
        memory, before = self._sleep_memory(), self._device_free()
        memory.sleep(set(tags), offload_weights)
        return self._device_free() - before

    def wake_up(self, tags: list[str]) -> None:
        self._sleep_memory().wake(set(tags))

    def reload_weights(self) -> None:
        """The checkpoint's weights again, in place (after a level 2 sleep's wake-up)."""
        from loom.worker.model_loader import reload_weights
        self._check_weights_awake()
        reload_weights(self.model_runner.model, self.config)

    def update_weights(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """Load (checkpoint name, tensor) pairs, some or all of the model's, in place."""
        from loom.worker.model_loader import reload_weights
        self._check_weights_awake()
        reload_weights(self.model_runner.model, self.config, list(weights))

    def _check_weights_awake(self) -> None:
        memory = self.model_runner.sleep_memory
        if memory is not None and "weights" in memory.asleep():
            raise ValueError("the weights are asleep: wake_up(tags=['weights']) first")

    def call_function(self, fn, args: list, kwargs: dict):
        """LLM.collective_rpc's call: a PUBLIC_METHODS name, or a caller's function run
        with this worker first (pickled, from another process)."""
        if isinstance(fn, str):
            known = self.PUBLIC_METHODS | self.extension_methods
            if fn not in known:
                raise ValueError(f"collective_rpc.method: {fn!r} is not a worker method "
                                 f"loom exposes; known: {', '.join(sorted(known))}")
            return getattr(self, fn)(*args, **kwargs)
        if isinstance(fn, bytes):
            import pickle
            fn = pickle.loads(fn)
        return fn(self, *args, **kwargs)

    def model_info(self) -> dict:
        arch = self.model_runner.arch
        return {"vocab_size": arch.vocab_size,
                "context_len": arch.context_len,
                "eos_token_id": arch.eos_token_ids[0] if arch.eos_token_ids else None,
                # the batch limits this device chose (`SchedulerConfig.resolved`)
                "max_num_seqs": self.config.scheduler.max_num_seqs,
                "max_num_batched_tokens": self.config.scheduler.max_num_batched_tokens}

    def time_all_reduce(self, num_tokens: int, iters: int, in_graph: bool = False) -> float:
        """Seconds per TP all-reduce of a [num_tokens, hidden] activation in the model's
        dtype, averaged over iters (every rank must call this together). in_graph (CUDA):
        the iters all-reduces are captured in one CUDA graph and replayed, as a decode step
        runs them, so host launch time is not counted."""
        runner = self.model_runner
        x = torch.ones(num_tokens, runner.arch.hidden_size, dtype=runner.dtype, device=self.device)
        for _ in range(3):
            tp_all_reduce(x)
        self._sync()
        if in_graph and self.device.type == "cuda":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(iters):
                    tp_all_reduce(x)
            graph.replay()
            self._sync()
            start = time.perf_counter()
            for _ in range(5):
                graph.replay()
            self._sync()
            return (time.perf_counter() - start) / (5 * iters)
        start = time.perf_counter()
        for _ in range(iters):
            tp_all_reduce(x)
        self._sync()
        return (time.perf_counter() - start) / iters

    ALLOCATOR_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries",
                          "num_ooms", "reserved_bytes.all.current")

    def allocator_stats(self) -> dict[str, int] | None:
        """This rank's CUDA caching allocator counters (None off CUDA): its device
        allocations and frees (cudaMalloc / cudaFree: each one stalls the host, a free
        the whole device too), its retries (an allocation that failed, so it freed every
        cached block and tried again) and the bytes it holds."""
        if self.device.type != "cuda":
            return None
        stats = torch.cuda.memory_stats(self.device)
        return {key: int(stats.get(key, 0)) for key in self.ALLOCATOR_COUNTERS}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def profile(self, action: str, out_dir: str | None = None) -> str | None:
        """"start" a torch.profiler session (host ops, and device kernels on CUDA, CUDA-graph
        replays included), or "stop" it: write this rank's Chrome trace and op table to
        out_dir and return the table, sorted by device time on CUDA (a second table by host
        time beside it there). "start-host" / "stop-host" do the same with Python's cProfile
        (host-rank*.txt: functions by own and by cumulative time)."""
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile
        cuda = self.device.type == "cuda"
        if action == "start-host":
            # Python's own profiler: which functions a step's host time goes to.
            self._host_profiler = cProfile.Profile()
            self._host_profiler.enable()
            return None
        if action == "stop-host" and getattr(self, "_host_profiler", None) is not None:
            if out_dir is None:
                raise ValueError("profile: 'stop-host' needs a directory")
            prof, self._host_profiler = self._host_profiler, None
            prof.disable()
            return _write_host_profile(prof, Path(out_dir) / f"host-rank{self.rank}.txt")
        if action == "start":
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            self._profiler = torch_profile(activities=activities,
                                           with_stack=envs.torch_profiler_with_stack())
            self._profiler.start()
            return None
        if action != "stop" or getattr(self, "_profiler", None) is None or out_dir is None:
            raise ValueError(f"profile: expected 'start', then 'stop' with a directory; got "
                             f"{action!r}")
        prof, self._profiler = self._profiler, None
        prof.stop()
        path = Path(out_dir)
        path.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path / f"trace-rank{self.rank}.json"))
        table = prof.key_averages().table(
            sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=30,
            max_name_column_width=80)
        (path / f"ops-rank{self.rank}.txt").write_text(table)
        if cuda:  # the host's side too: where an eagerly run step spends its launch time
            (path / f"ops-cpu-rank{self.rank}.txt").write_text(prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=80))
        return table

    def profile_steps(self, start: int, count: int, out_dir: str) -> None:
        """Profile (as `profile`) the launches start .. start + count - 1 from now (1-based),
        inside a run: this rank starts and stops the profiler itself between two of its
        steps, where no RPC can reach it. `profile_steps_result` collects the outcome."""
        if start < 1 or count < 1:
            raise ValueError(f"profile_steps: start and count must be positive, got {start}, "
                             f"{count}")
        self._step_window = _StepWindow(start, count, out_dir)

    def profile_steps_result(self) -> dict | None:
        """The window's op table (None if the run never reached it) and the file listing
        what its steps held (prompt tokens, decodes), beside the trace; the profiler is
        stopped here if the run ended inside the window. None: no window was armed."""
        window, self._step_window = self._step_window, None
        if window is None:
            return None
        if window.steps and window.table is None:
            window.table = self._stop_step_profile(window)
        steps_file = Path(window.out_dir) / f"steps-rank{self.rank}.json"
        steps_file.parent.mkdir(parents=True, exist_ok=True)
        steps_file.write_text(json.dumps(window.steps))
        return {"table": window.table, "steps_file": str(steps_file)}

    def _stop_step_profile(self, window: _StepWindow) -> str:
        self._sync()  # the window's last step must be on the device before the trace ends
        return self.profile("stop", window.out_dir)

    def _watch_step(self, so: SchedulerOutput) -> str | None:
        """Counts a launch; the label of a step inside the window ("loom step N: P prompt
        tokens + D decodes", N counted from the run's first launch), else None."""
        window = self._step_window
        window.launches += 1
        if window.launches == window.start:
            self.profile("start")
        if window.start <= window.launches < window.start + window.count:
            counts = so.num_scheduled_tokens.values()
            step = {"prompt_tokens": sum(n for n in counts if n > 1),
                    "decodes": sum(1 for n in counts if n == 1)}
            window.steps.append(step)
            return (f"loom step {window.launches}: {step['prompt_tokens']} prompt tokens + "
                    f"{step['decodes']} decodes")
        if window.launches == window.start + window.count:
            window.table = self._stop_step_profile(window)
        return None

    @staticmethod
    def get_env(name: str) -> str | None:
        return os.environ.get(name)

    def determine_num_blocks(self) -> int:
        return self.model_runner.determine_num_blocks()

    def initialize_cache(self, num_blocks: int) -> None:
        self.model_runner.initialize_cache(num_blocks)

    def launch(self, so: SchedulerOutput) -> StepHandle:
        if self._step_window is not None and self._step_window.table is None:
            label = self._watch_step(so)
            if label is not None:  # the trace names each step's launches (step_trace.py)
                with torch.profiler.record_function(label):
                    return self.model_runner.launch(so)
        return self.model_runner.launch(so)


@dataclass
class _StepWindow:
    """Steps a worker profiles by itself (`Worker.profile_steps`)."""
    start: int
    count: int
    out_dir: str
    launches: int = 0
    steps: list[dict] = field(default_factory=list)
    table: str | None = None


def _write_host_profile(prof: cProfile.Profile, path: Path) -> str:
    """Functions by own time, then by cumulative time; returns the text written."""
    out = io.StringIO()
    for key in ("tottime", "cumulative"):
        out.write(f"=== sorted by {key}\n")
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(40)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(out.getvalue())
    return out.getvalue()
