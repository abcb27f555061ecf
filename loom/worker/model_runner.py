"""The model runner: one step's schedule in, sampled tokens (and logprobs) out.

It owns the model, the paged KV cache and the per-request state of one rank.
"""

from __future__ import annotations

import logging
import os
import time

import torch

from loom.config import EngineConfig
from loom.core.sched_output import ModelRunnerOutput, SchedulerOutput
from loom.engine.protocol import Logprobs
from loom.forward_context import ForwardContext, forward_context
from loom.layers.attention import set_fused_rope
from loom.layers.rotary import is_partial
from loom.compilation.backend import CompiledForward
from loom import envs, heap
from loom.distributed.ops import init_small_all_reduce
from loom.distributed.parallel_state import enable_symmetric_memory, get_tp_group
from loom.kernels import jit_watch
from loom.kernels.host import round_up
from loom.lora.manager import make_lora_manager
from loom.worker.cuda_graph import CUDAGraphRunner, mixed_sizes, mode_line, piecewise_sizes
from loom.worker.layer_clock import LayerClock
from loom.worker.input_batch import (CachedRequestState, PendingTokens, RequestStates,
                                     SampledSteps, StepBatch, build_batch)
from loom.worker.logits_processors import CustomProcessors
from loom.worker.model_loader import load_model, resolve_kv_cache_dtype
from loom.worker.moe_warmup import warm_up_moe
from loom.models.st_dense import dense_modules
from loom.worker.device_setup import resolved_for_device, select_backend
from loom.worker.drafter import make_drafter
from loom.worker.pooler import Pooler
from loom.worker.sleep_memory import SleepMemory, kv_zeros
from loom.worker.sampler import (Sampler, SamplingMetadata, compute_prompt_logprobs,
                                 greedy_argmax)
from loom.worker.spec_verify import verify_step
from loom.worker.step_handle import StepHandle
from loom.worker.warmup import capture_pieces, plan_pieces, warm_up

logger = logging.getLogger(__name__)

CPU_DEFAULT_KV_BYTES = 1 << 30


class ModelRunner:
    def __init__(self, config: EngineConfig, device: torch.device, is_driver: bool = True) -> None:
        config = resolved_for_device(config, device)  # the Worker has; a bare runner not
        self.config = config
        self.is_driver = is_driver
        """Only the driver rank samples; the others still join the logits all-gather."""
        self.device = device
        self._layer_times = device.type == "cuda" and envs.layer_times()
        """LOOM_LAYER_TIMES: clock each eagerly run step's layers (read once, not per step)."""
        self.block_size = config.cache.block_size
        start = time.perf_counter()
        self.model, self.arch, self.dtype = load_model(config, device)
        logger.info("loaded %s (%s, %s) in %.1f s", self.arch.architecture, self.dtype, device,
                    time.perf_counter() - start)
        self.lora = make_lora_manager(self.model, self.arch, config, device, self.dtype)
        self.kv_dtype = resolve_kv_cache_dtype(config.cache.cache_dtype, self.dtype)
        if self.kv_dtype != self.dtype:
            logger.info("KV cache in %s (the model computes in %s): keys and values stored "
                        "unscaled, saturated at +-%g", str(self.kv_dtype).removeprefix("torch."),
                        str(self.dtype).removeprefix("torch."), torch.finfo(self.kv_dtype).max)
        self.backend = select_backend(device)
        self.sampler = Sampler(config.model.logprobs_mode)
        self.logits_procs = CustomProcessors.make(config, device, is_driver)
        self.requests = RequestStates(config.scheduler.max_num_seqs,
                                      config.model.max_model_len or self.arch.context_len,
                                      self.block_size)
        model_dir = config.model.model if os.path.isdir(config.model.model) else None
        self.pooler = Pooler(getattr(self.model, "classify", None),
                             getattr(self.model, "classify_row", -1),
                             dense_modules(model_dir, device) if model_dir else None)
        self.kv_caches: list[torch.Tensor] = []
        self.forward = self.model.forward
        self.graph_runner: CUDAGraphRunner | None = None
        self.piece_sizes: list[int] = []
        """Token counts other batches are padded up to (cudagraph_mode PIECEWISE, FULL and
        FULL_AND_PIECEWISE)."""
        self._pending: PendingTokens | None = None
        """The last launched step's sampled tokens: inputs of the next step's decodes."""
        self._sampled = SampledSteps(every=self.logits_procs is not None)
        self.drafter = make_drafter(config, self.arch.vocab_size, self.requests.tokens.shape[1],
                                    device, self.backend, is_driver)
        self.sleep_memory = SleepMemory.for_runner(self) if config.model.enable_sleep_mode else None

    # KV cache sizing -------------------------------------------------------------------
    @property
    def encoder(self) -> bool:
        """An encoder (`loom.models.bert`) keeps no KV cache."""
        return getattr(self.model, "is_encoder", False)

    @property
    def kv_block_bytes(self) -> int:
        attn = self.model.model.layers[0].self_attn.attn
        per_token = 2 * attn.num_kv_heads * attn.head_dim * self.kv_dtype.itemsize
        return per_token * self.block_size * self.arch.num_layers + (
            self.drafter.kv_block_bytes if self.drafter is not None else 0)

    def determine_num_blocks(self) -> int:
        if self.encoder:  # the scheduler's bookkeeping only: room for every request
            length = self.config.model.max_model_len or self.arch.context_len
            return round_up(length, self.block_size) // self.block_size \
                * self.config.scheduler.max_num_seqs
        budget = self.config.cache.kv_cache_memory_bytes
        if budget is None:
            budget = (self._free_memory_for_kv() if self.device.type == "cuda"
                      else CPU_DEFAULT_KV_BYTES)
        return max(0, budget // self.kv_block_bytes)

    def _free_memory_for_kv(self) -> int:
        torch.cuda.reset_peak_memory_stats(self.device)
        self.profile_run()
        peak = torch.cuda.max_memory_allocated(self.device)
        total = torch.cuda.get_device_properties(self.device).total_memory
        regions = self.sleep_memory.nbytes if self.sleep_memory is not None else 0
        return int(total * self.config.cache.gpu_memory_utilization) - peak - regions

    @torch.inference_mode()
    def profile_run(self) -> None:
        """A forward at the largest batch, attention skipped, to measure activation memory."""
        n = round_up(self.config.scheduler.max_num_batched_tokens, self.token_multiple)
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        positions = torch.zeros(n, dtype=torch.long, device=self.device)
        with forward_context(ForwardContext(None, self.kv_caches, self.backend)):
            hidden = self.forward(ids, positions)
            self.model.compute_logits(hidden[:self.config.scheduler.max_num_seqs])
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def initialize_cache(self, num_blocks: int) -> None:
        if self.encoder:
            self._compile_and_capture()  # (eager: nothing is compiled or captured)
            return
        attn = self.model.model.layers[0].self_attn.attn
        shape = (2, num_blocks, self.block_size, attn.num_kv_heads, attn.head_dim)
        try:
            self.kv_caches = kv_zeros(self.sleep_memory, self.arch.num_layers, shape,
                                      self.kv_dtype, self.device)
        except (RuntimeError, MemoryError) as e:  # torch's allocator says RuntimeError
            if "memory" not in str(e).lower() and not isinstance(e, MemoryError):
                raise
            field = ("num_gpu_blocks_override" if self.config.cache.num_gpu_blocks_override
                     else "kv_cache_memory_bytes")  # the flag that asked for them
            raise ValueError(f"{field}: {num_blocks} blocks of KV cache "
                             f"({num_blocks * self.kv_block_bytes / 2**30:.1f} GiB) cannot be "
                             f"allocated on {self.device}: {e}") from None
        if self.drafter is not None:
            self.drafter.initialize_cache(num_blocks, self.sleep_memory)
        self._compile_and_capture()
        if self.drafter is not None and not self.config.enforce_eager \
                and cuda_graphs_on(self.device):
            self.drafter.capture(self.decode_graph_sizes(), self.config.scheduler.max_num_seqs)
        capture_pieces(self)
        if self.device.type == "cuda":  # from here on, a Triton compile stalls a step: say so
            jit_watch.arm()
        heap.settle()  # each TP worker steps in Python too

    def _compile_and_capture(self) -> None:
        cfg = self.config
        tp_size = cfg.parallel.tensor_parallel_size
        if cfg.compilation.pass_config.enable_async_tp and self.device.type == "cuda" \
                and tp_size > 1 and not cfg.enforce_eager:
            enable_symmetric_memory("tp")
        off = cfg.parallel.disable_custom_all_reduce
        if init_small_all_reduce("tp", self.dtype, self.device, disabled=off):
            logger.info("all-reduces up to %d bytes: one-shot over symmetric memory; larger: NCCL",
                        envs.symm_all_reduce_max_bytes())
        elif off and tp_size > 1 and self.device.type == "cuda":
            logger.info("disable_custom_all_reduce: every all-reduce through NCCL (no one-shot "
                        "or fused all-reduce + norm kernels)")
        # Before compiling: the traced graph keeps or leaves out the rotary kernels for good.
        fuse_rope = self.backend.fuses_rope
        if fuse_rope and is_partial(self.model):
            logger.info("partial rotary embedding: q and k rotate in the model's graph, not "
                        "in the attention backend's cache-write kernel (whole heads only)")
            fuse_rope = False
        set_fused_rope(self.model, fuse_rope)
        self.forward = CompiledForward(self.model, cfg.compilation, cfg.enforce_eager, tp_size)
        if self.forward.level > 0:
            start = time.perf_counter()
            self.profile_run()  # traces and compiles the general graph once, up front
            logger.info("torch.compile level %d: %.1f s", self.forward.level,
                        time.perf_counter() - start)
        if self.device.type == "cuda":  # the fused MoE's Triton kernels, every config
            warm_up_moe(self.model, round_up(cfg.scheduler.max_num_batched_tokens,
                                              self.token_multiple),
                        self.token_multiple, self.device)
        if self.backend.name == "triton":  # JIT kernels: compile them before serving
            warm_up(self)
        if cfg.enforce_eager or not cuda_graphs_on(self.device):
            return
        if cfg.compilation.piece_graphs:
            self.piece_sizes = plan_pieces(self)
        sizes = self.decode_graph_sizes()
        mixed = self.mixed_graph_sizes(sizes)
        if (line := mode_line(cfg.compilation.cudagraph_mode, mixed)) is not None:
            logger.info(line)
        if not sizes:
            return
        max_len = cfg.model.max_model_len or self.arch.context_len
        self.graph_runner = CUDAGraphRunner(
            self.forward, self.backend, self.kv_caches, list(sizes),
            -(-max_len // self.block_size), max_len, self.device, mixed,
            cfg.scheduler.max_num_seqs, max_query=self.verify_query)
        self._capture_decode_graphs()

    def decode_graph_sizes(self) -> list[int]:
        """The pure decode batch sizes captured in CUDA graphs ([] where none are)."""
        cfg = self.config
        # Decode graphs need a real CUDA device even where the CPU tests patch cuda_graphs_on.
        if cfg.enforce_eager or self.device.type != "cuda" or not cfg.compilation.decode_graphs:
            return []
        sizes = cfg.compilation.capture_sizes(cfg.scheduler.max_num_seqs)
        # Every forward runs a multiple of the TP size; a graph of 1 would never replay.
        return sorted({round_up(s, self.token_multiple) for s in sizes})

    def mixed_graph_sizes(self, decode_sizes: list[int]) -> list[int]:
        """The mixed-batch graphs, by token count: cudagraph_mode FULL's, and the verify
        steps' under FULL_AND_PIECEWISE with drafts (`verify_query`); [] otherwise."""
        if self.config.compilation.cudagraph_mode != "FULL" and self.verify_query is None:
            return []
        pieces = piecewise_sizes(self.config.scheduler.max_num_batched_tokens)
        return mixed_sizes(sorted({round_up(s, self.token_multiple) for s in pieces}),
                           decode_sizes, self.verify_query)

    @property
    def verify_query(self) -> int | None:
        """Under FULL_AND_PIECEWISE with speculative decoding, a verify step's 1 + k tokens a
        request: the longest query its mixed graphs take (None: no such graphs)."""
        spec = self.config.speculative
        if spec is None or self.config.compilation.cudagraph_mode != "FULL_AND_PIECEWISE":
            return None
        return spec.num_speculative_tokens + 1

    def _capture_decode_graphs(self) -> None:
        """Capture the decode graphs. They take their memory after the KV cache was sized,
        so running out here means the budget left too little: say which setting to lower."""
        try:
            self.graph_runner.capture()
        except torch.OutOfMemoryError:
            cache = self.config.cache
            kv_gib = self.kv_caches[0].shape[1] * self.kv_block_bytes / 2**30
            setting = (f"kv_cache_memory_bytes (now {cache.kv_cache_memory_bytes})"
                       if cache.kv_cache_memory_bytes is not None else
                       f"gpu_memory_utilization (now {cache.gpu_memory_utilization})")
            sizes = self.graph_runner.sizes
            raise ValueError(
                f"{setting}: the decode batches' CUDA graphs (sizes {sizes[0]}..{sizes[-1]}) "
                f"ran out of GPU memory beside a {kv_gib:.1f} GiB KV cache; lower it, capture "
                "fewer sizes (cudagraph_capture_sizes) or pass --enforce-eager") from None

    @property
    def token_multiple(self) -> int:
        """Batches are padded to a multiple of this (TP size under sequence parallelism)."""
        return getattr(self.forward, "token_multiple", 1)

    # One step ---------------------------------------------------------------------------
    @torch.inference_mode()
    def launch(self, so: SchedulerOutput) -> StepHandle:
        """Queue one step on the device and return without waiting for it; the handle's
        output() reads the results back. Steps must be read back in launch order."""
        reqs = self.requests.apply(so)
        self.pooler.drop(so.finished_req_ids)
        if not reqs:
            return StepHandle.done(ModelRunnerOutput())
        counts = list(so.num_scheduled_tokens.values())
        batch = build_batch(self.requests, reqs, counts, self.block_size, self.device,
                            self.token_multiple, self._pending, self._padded_rows(counts))
        lora_errors = (self.lora.prepare([r.lora_request for r in reqs], counts,
                                         len(batch.input_ids)) if self.lora is not None else {})
        graphs, clock = self.graph_runner, None
        size = graphs.padded_size(batch) if graphs else None
        mixed = graphs.mixed_size(batch) if graphs and size is None else None
        if size is not None:
            hidden = graphs.run(batch, size)
        elif mixed is not None:
            hidden = graphs.run_mixed(batch, mixed)
        else:
            if self._layer_times:
                clock = LayerClock(batch.input_ids.shape[0])
            ctx = ForwardContext(batch.attn_metadata, self.kv_caches, self.backend, clock)
            with forward_context(ctx):
                hidden = self.forward(batch.input_ids, batch.positions)
            if clock is not None:
                clock.mark()
        seq_lens = batch.attn_metadata.seq_lens_cpu.tolist()
        # Where each request's first sampled token goes: past its seq_len's drafts, if any.
        lands = (seq_lens if batch.spec is None else
                 [n - len(r.spec_token_ids) for n, r in zip(seq_lens, reqs)])
        handle = StepHandle(self, reqs, lands, batch.sample_rows)
        handle.layer_clock, handle.lora_errors = clock, lora_errors
        tokens = None
        if batch.sample_rows:
            logits = self.model.compute_logits(hidden[batch.logits_indices]).float()
            num = len(batch.sample_rows)  # then the drafts' rows
            tokens, handle.logprobs = (self._sample(reqs, batch.sample_rows, logits[:num],
                                                    so.grammar_bitmask, seq_lens, lands)
                                       if self.is_driver else (None, None))
            if batch.spec is not None and self.is_driver:  # [R, K + 1]: accepted drafts,
                tokens, handle.draft_logprobs = verify_step(  # then one more
                    reqs, batch, logits[num:], tokens, self.arch.vocab_size)
                handle.draft_counts = batch.spec.counts
            tokens = self._share_tokens(tokens, batch.sampled_shape)
            self._pending = (tokens if tokens.dim() == 1 else tokens[:, 0],
                             {reqs[i].req_id: k for k, i in enumerate(batch.sample_rows)})
        else:
            self._pending = None
        drafts = None if self.drafter is None else \
            self.drafter.launch(self.requests, reqs, counts, batch, tokens)  # behind the step
        if tokens is not None:
            handle.read_back(tokens, drafts)
            self._sampled.record(handle)
        if self.is_driver:
            handle.pooled = self._pool(reqs, batch, hidden)
        handle.prompt_logprobs = self._prompt_logprobs(batch, hidden)
        for req, seq_len in zip(reqs, seq_lens):
            req.num_computed_tokens = seq_len
        return handle

    def _padded_rows(self, counts: list[int]) -> int | None:
        """The piecewise-graph size a batch is padded up to; None where a decode graph takes
        it, or it is larger than every size."""
        if not self.piece_sizes:
            return None
        if self.graph_runner is not None and max(counts) == 1 \
                and len(counts) <= self.graph_runner.sizes[-1]:
            return None
        total = sum(counts)
        return next((s for s in self.piece_sizes if s >= total), None)

    def _share_tokens(self, tokens: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor:
        """Every rank feeds the sampled tokens to its next step: the driver's, broadcast on
        the device (queued like any collective, no host round trip)."""
        group = get_tp_group()
        if group.world_size == 1:
            return tokens
        if tokens is None:
            tokens = torch.empty(shape, dtype=torch.long, device=self.device)
        torch.distributed.broadcast(tokens, src=0, group=group.group)
        return tokens

    def _pool(self, reqs: list[CachedRequestState], batch: StepBatch,
              hidden: torch.Tensor) -> dict[str, list[float]]:
        """Fold pooling requests' rows (before num_computed_tokens moves past them)."""
        out = {}
        starts = batch.attn_metadata.query_start_loc_cpu.tolist()
        for i, req in enumerate(reqs):
            if req.pooling_params is None:
                continue
            vector = self.pooler.fold(req.req_id, req.pooling_params,
                                      hidden[starts[i]:starts[i + 1]], req.num_computed_tokens,
                                      req.num_prompt_tokens)
            if vector is not None:
                out[req.req_id] = vector.tolist()
        return out

    def _sample(self, reqs, rows, logits, grammar_bitmask, seq_lens, lands):
        """The sampled tokens (on the device) and, for the handle, a function making the
        requested logprobs structs once the step is read back. A row samples output number
        seq_len - prompt (after any drafts, and any tokens in flight, read back first if it
        reads its outputs): its seed's."""
        chosen = [reqs[i] for i in rows]
        self._sampled.catch_up(self.requests, chosen, rows, lands)
        custom = self.logits_procs.step(chosen) if self.logits_procs is not None else None
        if not grammar_bitmask and custom is None and all(r.plain_greedy for r in chosen):
            # The common decode case needs no sampling metadata: one argmax.
            return greedy_argmax(logits), None
        meta = SamplingMetadata.for_requests(chosen, [seq_lens[i] for i in rows], self.device,
                                             self.arch.vocab_size, grammar_bitmask, custom,
                                             self.requests.tokens)
        out = self.sampler(logits, meta)
        if out.logprobs is None:
            return out.sampled_token_ids.long(), None
        num_top = [r.params.logprobs for r in chosen]
        return out.sampled_token_ids.long(), lambda: out.logprobs.to_structs(num_top)

    def _prompt_logprobs(self, batch: StepBatch, hidden: torch.Tensor) -> dict[str, list[Logprobs]]:
        out = {}
        for req_id, (rows, next_ids) in batch.prompt_logprob_rows.items():
            num_top = self.requests[req_id].params.prompt_logprobs
            logits = self.model.compute_logits(hidden[torch.as_tensor(rows, device=self.device)])
            if not self.is_driver:
                continue
            tensors = compute_prompt_logprobs(logits, torch.as_tensor(next_ids, device=self.device),
                                              num_top, self.sampler.logprobs_mode)
            out[req_id] = tensors.to_structs([num_top] * len(rows))
        return out


def cuda_graphs_on(device: torch.device) -> bool:
    """Whether CUDA graphs can be captured here (CPU tests patch it, with a stand-in graph)."""
    return device.type == "cuda"

