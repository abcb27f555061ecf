"""CUDA graphs of the whole forward (attention included), replayed for pure-decode steps
and, under cudagraph_mode FULL, for mixed and prefill steps of up to the largest decode size.

A decode step of a small batch is a few hundred tiny kernels; launching them from Python
costs more than running them. Each capture size gets one graph over static input and
metadata buffers; a batch is padded up to the nearest size (padding rows write no KV and
attend to one key, so they stay finite and are dropped).

A mixed graph of T tokens holds any batch of at most T tokens over at most min(T,
max_num_seqs) requests: its attention metadata is fixed-shape (`AttentionMetadata.
fixed_shape`), the requests past the batch's have empty queries, and the Triton backend
attends for all of them in one packed launch whose grid depends on T and the request
bound only (`paged_prefill(packed_tokens=...)`).
"""

from __future__ import annotations

import logging
import time

import torch

from loom.attention.backend import AttentionBackend, AttentionMetadata
from loom.forward_context import ForwardContext, forward_context
from loom.worker.input_batch import StepBatch

logger = logging.getLogger(__name__)


MODE_LINES = {
    "FULL": "cudagraph_mode FULL: batches of up to the largest capture size replay "
            "whole-forward CUDA graphs, mixed and prefill batches too (%s); "
            "larger ones replay piecewise graphs (level 3)",
    "PIECEWISE": "cudagraph_mode PIECEWISE: decode batches replay the pieces, their attention "
                 "run eagerly between them, with no whole-forward graph; 8B decode at batch 1 "
                 "took 5.3-14.1 (bound by host time, which varies by machine) against 4.2 "
                 "ms/token under the default FULL_AND_PIECEWISE (H200, run_zzz64-67)",
}
"""Said once at start-up where CUDA graphs are on: what these vLLM modes mean in loom."""


def mode_line(mode: str, mixed: list[int]) -> str | None:
    """MODE_LINES' line for `mode` (None: nothing to say), with FULL's mixed graph sizes."""
    if mode != "FULL":
        return MODE_LINES.get(mode)
    return MODE_LINES[mode] % (f"padded to {mixed} tokens" if mixed else
                               "none here: no decode batch size is captured")


PIECEWISE_SIZES = (8, 16, 32, 64, 128, 256, 512, *range(576, 1025, 64),
                   *range(1152, 2049, 128))
"""Token counts that other batches are padded up to under `cudagraph_mode:
FULL_AND_PIECEWISE`. Powers of two up to 512: there a step reads every weight once whatever
its size, so padding costs little GPU time. Above, where the matmuls grow with the tokens,
steps of 64 then 128 (at most 12.5% padding): a 10 QPS step of one 550-token prompt and ~14
decodes ran its pieces eagerly at 33-37 ms and, padded to 576, at 23 ms (run_zzz6). The
graphs of every size share their memory (`compilation/piece_graph.py`), so more sizes cost
little more of it; all are captured at start-up (`warmup.capture_pieces`, ~50 ms a size)."""


def piecewise_sizes(max_num_batched_tokens: int) -> list[int]:
    """PIECEWISE_SIZES up to the first that holds max_num_batched_tokens."""
    sizes = []
    for size in PIECEWISE_SIZES:
        sizes.append(size)
        if size >= max_num_batched_tokens:
            break
    return sizes


def mixed_sizes(piece_sizes: list[int], decode_sizes: list[int],
                verify_query: int | None = None) -> list[int]:
    """The token counts of the mixed graphs: those other batches are padded to
    (`piecewise_sizes`), up to the first that holds the largest decode size, as vLLM's FULL
    captures every batch of up to its largest capture size. With verify_query (the verify
    steps' graphs under FULL_AND_PIECEWISE), up to the first that holds that many tokens for
    each request of the largest decode batch, at most VERIFY_MAX."""
    if not decode_sizes:
        return []
    top = max(decode_sizes) if verify_query is None else \
        min(max(decode_sizes) * verify_query, VERIFY_MAX)
    sizes = []
    for size in piece_sizes:
        if size > 1:
            sizes.append(size)
        if size >= top:
            break
    return sizes


VERIFY_MAX = 512
"""The most tokens of FULL_AND_PIECEWISE's verify-step graphs: as many as FULL's mixed graphs
take by default; larger verify steps replay the pieces."""


class CUDAGraphRunner:
    def __init__(self, forward, backend: AttentionBackend, kv_caches: list[torch.Tensor],
                 sizes: list[int], max_blocks_per_req: int, max_model_len: int,
                 device: torch.device, mixed: list[int] = (), max_num_seqs: int = 0,
                 name: str = "", max_query: int | None = None) -> None:
        """name: whose graphs, in the log line (the target's: none). max_query: the longest
        query of a request the mixed graphs take (None: any; a verify step's 1 + k under
        FULL_AND_PIECEWISE, as vLLM's uniform-decode full graphs)."""
        self.max_query = max_query
        self.forward, self.backend, self.kv_caches = forward, backend, kv_caches
        self.name = f"{name}: " if name else ""
        self.sizes = sorted(set(sizes))
        self.mixed_sizes = sorted(set(mixed))
        """Token counts of the mixed graphs (cudagraph_mode FULL); none otherwise."""
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        n = max([self.sizes[-1], *self.mixed_sizes])
        i32 = dict(dtype=torch.int32, device=device)
        # Inference tensors, like every step's inputs (made under inference_mode): Dynamo
        # guards on a tensor's dispatch keys, and normal tensors here made the capture
        # trace and compile the whole forward a second time.
        with torch.inference_mode():
            self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
            self.positions = torch.zeros(n, dtype=torch.long, device=device)
            self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
            self.seq_lens = torch.ones(n, **i32)
            self.query_start_loc = torch.arange(n + 1, **i32)
            self.block_table = torch.zeros(n, max_blocks_per_req, **i32)
            # Mixed graphs' own: the decode graphs read query_start_loc as it was made.
            self.mixed_starts = torch.zeros(n + 1, **i32)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.mixed_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}

    def mixed_reqs(self, size: int) -> int:
        """The most requests a mixed graph of `size` tokens holds."""
        return min(size, self.max_num_seqs) if self.max_num_seqs else size

    def _mixed_metadata(self, size: int) -> AttentionMetadata:
        # A verify graph's queries are at most max_query tokens: the Triton backend gives
        # such short ones the split-K decode kernel.
        reqs = self.mixed_reqs(size)
        return AttentionMetadata(
            num_actual_tokens=size, num_reqs=reqs,
            max_query_len=min(size, self.max_query or size),
            max_seq_len=self.max_model_len, query_start_loc=self.mixed_starts[:reqs + 1],
            seq_lens=self.seq_lens[:reqs], block_table=self.block_table[:reqs],
            slot_mapping=self.slot_mapping[:size],
            query_start_loc_cpu=torch.zeros(reqs + 1, dtype=torch.int32),
            seq_lens_cpu=torch.zeros(reqs, dtype=torch.int32), fixed_shape=True)

    def _metadata(self, size: int) -> AttentionMetadata:
        # max_seq_len is the worst case, so the decode kernel's split count baked into the
        # graph suits any context length.
        return AttentionMetadata(
            num_actual_tokens=size, num_reqs=size, max_query_len=1, max_seq_len=self.max_model_len,
            query_start_loc=self.query_start_loc[:size + 1], seq_lens=self.seq_lens[:size],
            block_table=self.block_table[:size], slot_mapping=self.slot_mapping[:size],
            query_start_loc_cpu=torch.arange(size + 1, dtype=torch.int32),
            seq_lens_cpu=torch.ones(size, dtype=torch.int32), fixed_shape=True)

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        took: dict[int, float] = {}
        # Largest first, so that later graphs reuse its memory. Every capture's buffers
        # hold what they were made with: decodes of one key and no KV writes, mixed
        # batches of empty queries.
        for size in reversed(self.mixed_sizes):
            self.mixed_graphs[size] = self._capture(self._mixed_metadata, size, pool)
        for size in reversed(self.sizes):
            begin = time.perf_counter()
            self.graphs[size] = self._capture(self._metadata, size, pool)
            took[size] = time.perf_counter() - begin
        torch.cuda.synchronize()
        slowest = max(took, key=took.get)
        mixed = (f" and {len(self.mixed_graphs)} of mixed batches ({self.mixed_sizes[0]}.."
                 f"{self.mixed_sizes[-1]} tokens)" if self.mixed_graphs else "")
        logger.info("%scaptured %d CUDA graphs (decode batch sizes %d..%d)%s in %.1f s (the "
                    "slowest, batch %d: %.2f s; the fastest %.2f s)", self.name, len(self.graphs),
                    self.sizes[0], self.sizes[-1], mixed, time.perf_counter() - start,
                    slowest, took[slowest], min(took.values()))

    def _capture(self, metadata, size: int, pool):
        """Warm up, then capture, each forward with metadata(size) made afresh: a backend
        may keep work per metadata object for the layers of one forward (the Triton
        backend's packed tile starts), which the capture must then record."""
        def forward():
            with forward_context(ForwardContext(metadata(size), self.kv_caches, self.backend)):
                return self.forward(self.input_ids[:size], self.positions[:size])
        for _ in range(2):  # warm up: Triton autotuning and compilation
            forward()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = forward()
        return graph, out

    def padded_size(self, batch: StepBatch) -> int | None:
        meta = batch.attn_metadata
        if not meta.is_pure_decode or meta.num_reqs > self.sizes[-1]:
            return None
        if batch.attn_metadata.block_table.shape[1] > self.block_table.shape[1]:
            return None
        return next(s for s in self.sizes if s >= meta.num_reqs)

    def mixed_size(self, batch: StepBatch) -> int | None:
        """The mixed graph a batch that no decode graph takes replays, if one holds it and
        the backend loses nothing there (`AttentionBackend.fits_one_launch`: the Triton
        backend's split-K decodes of a wide or long mixed batch stay out of graphs)."""
        meta = batch.attn_metadata
        size = next((s for s in self.mixed_sizes if s >= meta.num_actual_tokens), None)
        if size is None or meta.num_reqs > self.mixed_reqs(size) or \
                (self.max_query is not None and meta.max_query_len > self.max_query) or \
                meta.block_table.shape[1] > self.block_table.shape[1] or \
                not self.backend.fits_one_launch(meta):
            return None
        return size

    def run_mixed(self, batch: StepBatch, size: int) -> torch.Tensor:
        meta, n = batch.attn_metadata, batch.attn_metadata.num_actual_tokens
        reqs = meta.num_reqs
        self.input_ids[:n].copy_(batch.input_ids[:n], non_blocking=True)
        self.positions[:n].copy_(batch.positions[:n], non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping[:n], non_blocking=True)
        self.slot_mapping[n:size].fill_(-1)  # padding rows: no KV write
        self.mixed_starts[:reqs + 1].copy_(meta.query_start_loc, non_blocking=True)
        self.mixed_starts[reqs + 1:self.mixed_reqs(size) + 1].fill_(n)  # empty requests
        self.seq_lens[:reqs].copy_(meta.seq_lens, non_blocking=True)
        self.block_table[:reqs, :meta.block_table.shape[1]].copy_(meta.block_table,
                                                                  non_blocking=True)
        graph, out = self.mixed_graphs[size]
        graph.replay()
        return out[:n]

    def run(self, batch: StepBatch, size: int) -> torch.Tensor:
        meta, n = batch.attn_metadata, batch.attn_metadata.num_reqs
        # The batch may carry padding rows of its own (sequence parallelism): real rows only.
        self.input_ids[:n].copy_(batch.input_ids[:n], non_blocking=True)
        self.positions[:n].copy_(batch.positions[:n], non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping[:n], non_blocking=True)
        self.seq_lens[:n].copy_(meta.seq_lens, non_blocking=True)
        self.block_table[:n, :meta.block_table.shape[1]].copy_(meta.block_table, non_blocking=True)
        if size > n:  # padding rows: no KV write, one key of attention
            self.slot_mapping[n:size].fill_(-1)
            self.seq_lens[n:size].fill_(1)
        graph, out = self.graphs[size]
        graph.replay()
        return out[:n]
