"""`EngineCore`: the step loop. Schedule, execute, update, emit outputs.

Everything a request needs beyond tokens in and tokens out (text, stop strings, n > 1)
lives in the frontend; this class only sees `EngineCoreRequest`s and returns
`EngineCoreOutputs`, the structs that cross ZeroMQ unchanged.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections import deque

import msgspec

from loom import envs, heap
from loom.config import EngineConfig
from loom.core.request import Request
from loom.core.sched_output import SchedulerOutput
from loom.core.scheduler import Scheduler
from loom.core.structured_output import StructuredOutputManager
from loom.engine.core_sleep import SleepMixin
from loom.engine.protocol import (EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest,
                                  LoRAInfo, ModelTasks)
from loom.executor.base import make_executor
from loom.lora.adapter import model_targets
from loom.models.arch import ModelArch, is_encoder, resolve_max_model_len
from loom.models.loader import generation_config_dir, resolve, tokenizer_path
from loom.pooling_params import PoolingParams
from loom.quantization.config import quant_scheme
from loom.tasks import check_dimensions, classified_length, model_tasks, unsupported

logger = logging.getLogger(__name__)

UTILITY_METHODS = frozenset({"reset_prefix_cache", "get_num_unfinished_requests", "get_kv_info",
                             "get_model_info", "profile", "sleep", "wake_up", "is_sleeping",
                             "call_workers"})


def _check_model(config: EngineConfig) -> ModelTasks:
    """The model's tasks, before any worker starts, so that a bad split, quantization or
    --runner fails here once, not in every rank."""
    tp, model = config.parallel.tensor_parallel_size, config.model
    if tp == 1 and model.quantization is None and model.model.endswith(".gguf"):
        # Nothing else to check, and reading a GGUF's metadata takes seconds: every GGUF
        # architecture loom reads is a causal LM, with a causal LM's tasks.
        return model_tasks({"architectures": ["LlamaForCausalLM"]}, model.runner, model.convert,
                           pooler=model.pooler_config)
    hf_config = resolve(model).hf_config
    arch = ModelArch.from_hf_config(hf_config)
    arch.check_tensor_parallel(tp)
    scheme = quant_scheme(hf_config, model.quantization)
    if is_encoder(arch.architecture):
        _check_encoder(config, scheme)
    model_dir = model.model if os.path.isdir(model.model) else None
    tasks = model_tasks(hf_config, model.runner, model.convert, model_dir, model.pooler_config)
    try:
        check_dimensions(tasks.default_dimensions, tasks)
    except ValueError as e:
        raise ValueError(f"pooler_config.{e}") from None
    return tasks


def _check_encoder(config: EngineConfig, scheme: object) -> None:
    if scheme is not None:
        raise ValueError("quantization: loom runs encoder (embedding) models unquantized")
    if config.lora is not None:
        raise ValueError("enable_lora: encoder (embedding) models take no LoRA adapters")
    if config.speculative is not None:
        raise ValueError("speculative_config: an encoder (embedding model) generates nothing")


def for_encoder(config: EngineConfig) -> EngineConfig:
    """An encoder runs each prompt whole, both ways, without a KV cache to cache prefixes
    in, and eagerly: no prefix caching, no compile, no CUDA graphs."""
    logger.info("encoder model: prompts run whole, eagerly, without a KV cache or prefix "
                "caching")
    return dataclasses.replace(config, enforce_eager=True, cache=dataclasses.replace(
        config.cache, enable_prefix_caching=False))


class EngineCore(SleepMixin):
    def __init__(self, config: EngineConfig) -> None:
        self.tasks = _check_model(config)
        """What the model serves (`loom.tasks`): requests for other tasks are refused."""
        self.encoder = is_encoder(self.tasks.architecture)
        if self.encoder:
            config = for_encoder(config)
        self.config = config
        self.executor = make_executor(config)
        info = self.executor.model_info
        # The workers filled in the device's batch defaults; the scheduler takes the same.
        self.config = config = dataclasses.replace(config, scheduler=dataclasses.replace(
            config.scheduler, max_num_seqs=info["max_num_seqs"],
            max_num_batched_tokens=info["max_num_batched_tokens"]))
        logger.info("batches: up to %d requests and %d tokens a step",
                    info["max_num_seqs"], info["max_num_batched_tokens"])
        self.vocab_size = info["vocab_size"]
        self.eos_token_id = info["eos_token_id"]
        self.max_model_len = resolve_max_model_len(config.model.max_model_len,
                                                   info["context_len"])
        self.max_logprobs = (self.vocab_size if config.model.max_logprobs == -1
                             else config.model.max_logprobs)
        lora = config.lora
        self.lora_info = None if lora is None else LoRAInfo(lora.max_lora_rank, model_targets(
            ModelArch.from_hf_config(resolve(config.model).hf_config)))
        self.num_blocks = self._init_kv_cache()
        if self.encoder and self.max_model_len > info["max_num_batched_tokens"]:
            raise ValueError(f"max_num_batched_tokens: an encoder runs each prompt in one "
                             f"step, so it must be at least max_model_len "
                             f"({self.max_model_len}), got {info['max_num_batched_tokens']}")
        self.scheduler = Scheduler(config.scheduler, config.cache, self.num_blocks,
                                   self.max_model_len, config.speculative,
                                   None if lora is None else lora.max_loras,
                                   whole_prompts=self.encoder)
        self._pending: list[EngineCoreOutput] = []
        self._in_flight: deque[tuple[SchedulerOutput, object]] = deque()
        """Launched steps not yet collected, oldest first."""
        self._profiling, self._profiles = False, 0
        """A start_profile not yet stopped; how many profiles were written."""
        self.step_observer = None
        """A benchmark's hook (`loom.bench.step_log.StepLog`): told of every step at launch
        and when its results are back."""
        self.structured_output = StructuredOutputManager(
            tokenizer_path(config.model), generation_config_dir(config.model.generation_config))
        # Again after the model runner's: the scheduler's KV blocks (one object each) were
        # built after it.
        heap.settle()

    def _init_kv_cache(self) -> int:
        num_blocks = self.executor.determine_num_blocks()
        override = self.config.cache.num_gpu_blocks_override
        if override is not None:
            logger.info("KV cache: %d blocks as --num-gpu-blocks-override asks (the memory "
                        "budget allowed %d)", override, num_blocks)
            num_blocks = override
        block_size = self.config.cache.block_size
        if num_blocks * block_size < self.max_model_len:
            raise ValueError(
                f"the KV cache holds {num_blocks * block_size} tokens, fewer than max_model_len "
                f"({self.max_model_len}); raise "
                + ("--num-gpu-blocks-override" if override is not None else
                   "--gpu-memory-utilization / --kv-cache-memory-bytes")
                + " or lower --max-model-len")
        self.executor.initialize_cache(num_blocks)
        logger.info("KV cache: %d blocks of %d tokens (%d tokens); max concurrency %.1fx at %d "
                    "tokens per request", num_blocks, block_size, num_blocks * block_size,
                    num_blocks * block_size / self.max_model_len, self.max_model_len)
        return num_blocks

    def add_request(self, request: EngineCoreRequest) -> None:
        """Queue a request; raises ValueError (and changes nothing) if it is invalid."""
        self.validate(request)
        params = request.pooling_params
        if params is not None and params.task == "embed":
            request = msgspec.structs.replace(request, pooling_params=self._embed_defaults(
                params))
        if request.pooling_params is not None and request.pooling_params.task != "embed":
            # A classifier reads one token: the prompt's tokens after it are not run.
            n = classified_length(request.prompt_token_ids, self.tasks.pad_token_id)
            request = msgspec.structs.replace(request,
                                              prompt_token_ids=request.prompt_token_ids[:n])
        core_request = Request.from_engine_core_request(request)
        core_request.grammar = self.structured_output.matcher_for(request.request_id,
                                                                  request.sampling_params)
        self.scheduler.add_request(core_request)

    def _embed_defaults(self, params: PoolingParams) -> PoolingParams:
        """An embed request with the model's pooling and the server's defaults (the model's
        sentence-transformers pooling, --pooler-config) where it leaves them unset."""
        tasks = self.tasks
        return msgspec.structs.replace(
            params, pooling_type=tasks.pooling_type or params.pooling_type,
            normalize=tasks.embed_normalize if params.normalize is None else params.normalize,
            dimensions=params.dimensions or tasks.default_dimensions)

    def validate(self, request: EngineCoreRequest) -> None:
        n = len(request.prompt_token_ids)
        if n == 0:
            raise ValueError("prompt: must not be empty")
        task = "generate" if request.pooling_params is None else request.pooling_params.task
        if not self.tasks.supports(task):
            raise ValueError(f"task: {unsupported(self.tasks, task, task)}")
        if request.pooling_params is not None:
            check_dimensions(request.pooling_params.dimensions, self.tasks)
        if request.pooling_params is not None and n > self.max_model_len:
            raise ValueError(f"input: {n} tokens is longer than max_model_len "
                             f"({self.max_model_len})")
        if request.pooling_params is None and n >= self.max_model_len:
            raise ValueError(f"prompt: {n} tokens leave no room for output within "
                             f"max_model_len ({self.max_model_len})")
        bad = [t for t in request.prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt: token id(s) {bad[:5]} outside the vocabulary "
                             f"(0..{self.vocab_size - 1})")
        if self.scheduler.has_request(request.request_id):
            raise ValueError(f"request_id: {request.request_id!r} is already running")

    def abort_requests(self, request_ids: list[str]) -> None:
        self._pending.extend(self.scheduler.abort_requests(request_ids))

    def abort_all(self) -> None:
        """Drop every request and collect the steps still in flight, outputs discarded: the
        offline LLM's recovery after an exception (Ctrl-C included) cut a step short, when
        the scheduler may count a token for a step that never launched."""
        self.scheduler.abort_requests(list(self.scheduler.requests))
        while self._in_flight:
            self._collect_one()
        self._pending = []

    def has_pending_outputs(self) -> bool:
        """Outputs the next step() returns without running anything (aborts, steps that a
        worker call collected)."""
        return bool(self._pending)

    def has_unfinished_requests(self) -> bool:
        """Whether step() has work: none while asleep (`SleepMixin`) but steps in flight."""
        return self._can_schedule() or bool(self._in_flight)

    def _can_schedule(self) -> bool:
        return not self._paused and self.scheduler.has_unfinished_requests()

    def step(self) -> EngineCoreOutputs:
        """Collect one step's outputs. Under async scheduling the next steps are scheduled and
        launched first (up to the executor's max_steps_in_flight), so the device never waits
        for this host work."""
        outputs, self._pending = self._pending, []
        ahead = self.config.scheduler.async_scheduling
        if not self._in_flight and self._can_schedule():
            self._launch(self.scheduler.schedule())
        while (ahead and 0 < len(self._in_flight) < self.executor.max_steps_in_flight
               and self._can_schedule()):
            if not self._launch_ahead():
                break
        if self._in_flight:
            outputs += self._collect_one()
            if ahead and not self._in_flight and self._can_schedule():
                # Nothing ran ahead of this step (a draft model's requests wait for each
                # read-back): launch the next one now, so that the device runs it while
                # this step's outputs are processed and sent.
                self._launch_ahead()
        return EngineCoreOutputs(outputs=outputs, timestamp=time.time(),
                                 scheduler_stats=self.scheduler.make_stats())

    def _launch_ahead(self) -> bool:
        """Schedule and launch a step before the last one's outputs are processed; False
        where nothing could be scheduled."""
        step = self.scheduler.schedule()
        if not step.is_empty or step.finished_req_ids:
            self._launch(step)
        return not step.is_empty

    def _collect_one(self) -> list[EngineCoreOutput]:
        scheduler_output, step = self._in_flight.popleft()
        result = self.executor.collect(step)
        if self.step_observer is not None:
            self.step_observer.collected()
        return self.scheduler.update_from_output(scheduler_output, result)

    def collective_rpc(self, method: str, *args) -> list:
        """A worker method on every rank, once the steps still in flight are collected
        (their outputs come with the next step()): a rank answers in order, so its reply
        would otherwise arrive behind a step's output. LLM.generate returns as soon as its
        requests finish, which can leave a step launched ahead."""
        while self._in_flight:
            self._pending += self._collect_one()
        return self.executor.collective_rpc(method, *args)

    def _launch(self, scheduler_output: SchedulerOutput) -> None:
        if self.step_observer is not None:
            self.step_observer.launched(scheduler_output, self.scheduler)
        self._in_flight.append((scheduler_output, self.executor.launch(scheduler_output)))
        if self.step_observer is not None:
            self.step_observer.enqueued()

    def call_utility(self, method: str, args: list) -> object:
        if method not in UTILITY_METHODS:
            raise ValueError(f"utility: unknown method {method!r}")
        return getattr(self, method)(*args)

    def reset_prefix_cache(self) -> bool:
        return self.scheduler.reset_prefix_cache()

    def call_workers(self, method, args: list | tuple = (), kwargs: dict | None = None) -> list:
        """LLM.collective_rpc / the server's /collective_rpc: a `Worker.PUBLIC_METHODS`
        method by name, or a function run with each worker first; the results by rank. A
        weight reload or update also resets the prefix cache (its KV came from the old
        weights)."""
        results = self.collective_rpc("call_function", method, list(args), kwargs or {})
        if method in ("reload_weights", "update_weights"):
            self.scheduler.reset_prefix_cache()
        return results

    def profile(self, start: bool) -> str | None:
        """vLLM's start_profile / stop_profile: torch.profiler on every rank, from a start to
        its stop, written to a new folder under LOOM_TORCH_PROFILER_DIR; a stop returns it."""
        out_dir = envs.torch_profiler_dir()
        if out_dir is None:
            raise ValueError("profile: the profiler is off; set LOOM_TORCH_PROFILER_DIR (vLLM's "
                             "VLLM_TORCH_PROFILER_DIR) to the folder its traces go to")
        if start == self._profiling:
            raise ValueError("profile: " + ("a profile is already running; stop it first"
                                            if start else "no profile is running; start one"))
        if start:
            try:  # a folder it cannot write to is said now, not after the profiled steps
                os.makedirs(out_dir, exist_ok=True)
                if not os.access(out_dir, os.W_OK):
                    raise PermissionError("not writable")
            except OSError as e:
                raise ValueError(f"LOOM_TORCH_PROFILER_DIR: cannot write profiles to "
                                 f"{out_dir}: {e}") from None
            self.collective_rpc("profile", "start")
            self._profiling = True
            return None
        self._profiling, self._profiles = False, self._profiles + 1  # a worker's is gone too
        folder = os.path.join(out_dir, f"{time.strftime('%Y%m%d-%H%M%S')}-pid{os.getpid()}-"
                                       f"{self._profiles}")
        self.collective_rpc("profile", "stop", folder)
        logger.info("torch.profiler: every rank's trace and op table written to %s", folder)
        return folder

    def get_num_unfinished_requests(self) -> int:
        return self.scheduler.get_num_unfinished_requests()

    def get_kv_info(self) -> dict:
        kv = self.scheduler.kv_cache_manager
        return {"num_blocks": self.num_blocks, "num_free_blocks": kv.num_free_blocks,
                "block_size": self.config.cache.block_size}

    def get_model_info(self) -> dict:
        return {"vocab_size": self.vocab_size, "max_model_len": self.max_model_len,
                "eos_token_id": self.eos_token_id, "max_logprobs": self.max_logprobs,
                "lora": self.lora_info,
                "scheduling_policy": self.config.scheduler.scheduling_policy,
                "logprobs_mode": self.config.model.logprobs_mode,
                "logits_processors": [p for p in self.config.model.logits_processors
                                      if isinstance(p, str)]}

    def shutdown(self) -> None:
        self.executor.shutdown()
