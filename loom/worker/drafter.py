"""A draft model's proposals for speculative decoding (vLLM's method "draft_model").

The draft model runs whole on the driver rank (under TP too: its proposals are the step's),
or, with draft_tensor_parallel_size the target's, sharded like it on every rank. It keeps a
paged KV cache of its own laid out like the target's: the same
block ids and slots, so one block table serves both, and a prefix-cache hit holds both
models' KV (the drafter computes every token the target keeps, in the same step).

The drafter's forwards are queued right behind each step's own kernels (`launch`), before
anything is read back, so the host prepares them while the device runs the target, and a
step's drafts come back in the same copy as its tokens (as vLLM's padded drafter batch):
  1. one forward over each request's tokens of the step and, where it samples, one slot
     more: the token it sampled is put, on the device, right after its accepted drafts
     (their number is known there only). Its draft KV is written, and that token's row
     gives the first draft. The rejected drafts' KV, written past it, is rewritten before
     anything attends to it: by the draft forwards below, or by the next step's feed,
     which starts at that token's successor;
  2. then k - 1 one-token forwards, each feeding the draft before it at the next
     position (positions and slots computed on the device) and taking the next.
Where the target has decode graphs, both replay CUDA graphs (the first a mixed graph
holding up to MIXED_MAX tokens): eagerly, a 16-layer draft's forward is hundreds of
launches from Python. Run after the read-back instead, the drafter left the device idle
while the host prepared each forward: the 1B drafting for itself took ~9.5 ms a step of
~6.5 ms of kernels (run_zzz118, H100).
A draft is the draft model's argmax: a point mass, which `spec_verify` accepts or redraws
so that every output token is still drawn from the target. Drafts' KV goes into the
slots past the request's tokens, allocated for it by the scheduler
(`SpeculativeConfig.lookahead`); a request with fewer free slots gets fewer drafts. The
next step recomputes those positions in the target, and its drafter rewrites their KV
with the tokens kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import numpy as np
import torch

from loom.attention.backend import AttentionBackend, AttentionMetadata
from loom.config import EngineConfig, ModelConfig
from loom.distributed.parallel_state import tp_alone
from loom.forward_context import ForwardContext, forward_context
from loom.layers.attention import set_fused_rope
from loom.kernels.host import cdiv
from loom.layers.rotary import is_partial
from loom.pinned import upload
from loom.worker.cuda_graph import CUDAGraphRunner, piecewise_sizes
from loom.worker.input_batch import StepBatch
from loom.worker.sampler import greedy_argmax
from loom.worker.sleep_memory import kv_zeros

logger = logging.getLogger(__name__)


MIXED_MAX = 512
"""The largest mixed graph of a step's fed tokens captured: a prompt's first forward, or a batch of
more than ~85 requests at k = 4, runs eagerly (its launches spread over more tokens)."""


def make_drafter(config: EngineConfig, target_vocab: int, max_model_len: int,
                 device: torch.device, backend: AttentionBackend,
                 is_driver: bool = True) -> Drafter | None:
    """The config's draft model, or None where it names none. By default only the driver
    rank drafts (its proposals are the step's): under TP it holds the whole draft model
    beside its shard of the target, and the other ranks hold none. With
    draft_tensor_parallel_size the target's, every rank holds its shard of the draft too,
    and all run it together (the LM head's logits are gathered: each rank's drafts are
    the same)."""
    spec = config.speculative
    if spec is None or spec.method != "draft_model" or not (is_driver or spec.sharded_draft):
        return None
    return Drafter(config, target_vocab, max_model_len, device, backend)


class Drafter:
    def __init__(self, config: EngineConfig, target_vocab: int, max_model_len: int,
                 device: torch.device, backend: AttentionBackend) -> None:
        from loom.worker.model_loader import load_model
        spec = config.speculative
        self.k = spec.num_speculative_tokens
        self.device, self.backend = device, backend
        self.block_size = config.cache.block_size
        self.max_model_len = max_model_len
        self._group = contextlib.nullcontext if spec.sharded_draft else tp_alone
        """Where the draft model is built and run: the target's TP group, or a group of one
        (whole on the driver, whatever the target's TP size)."""
        # As vLLM's: the target's dtype and load format (dummy weights draft dummy ones).
        start = time.perf_counter()
        try:
            draft = ModelConfig(model=spec.model, dtype=config.model.dtype,
                                max_model_len=max_model_len, seed=config.model.seed,
                                load_format=config.model.load_format,
                                download_dir=config.model.download_dir)
            with self._group():
                self.model, arch, self.dtype = load_model(
                    dataclasses.replace(config, model=draft, speculative=None, lora=None),
                    device)
        except (OSError, ValueError) as e:
            raise ValueError(f"speculative_config.model: {spec.model!r}: {e}") from None
        if getattr(self.model, "is_encoder", False) or not hasattr(self.model, "compute_logits"):
            raise ValueError(f"speculative_config.model: {spec.model!r} ({arch.architecture}) "
                             "is not a causal LM: a draft model must generate")
        self.vocab = min(arch.vocab_size, target_vocab)
        """Drafts are taken from the ids both vocabularies hold (sizes differ by padding)."""
        set_fused_rope(self.model, backend.fuses_rope and not is_partial(self.model))
        self.num_layers = arch.num_layers
        self.kv_caches: list[torch.Tensor] = []
        self.graphs: CUDAGraphRunner | None = None
        logger.info("draft model %s (%s, %s) loaded in %.1f s; %d drafts a step", arch.architecture,
                    self.dtype, device, time.perf_counter() - start, self.k)

    @property
    def _attn(self):
        return self.model.model.layers[0].self_attn.attn

    @property
    def kv_block_bytes(self) -> int:
        attn = self._attn
        return (2 * attn.num_kv_heads * attn.head_dim * self.dtype.itemsize
                * self.block_size * self.num_layers)

    def initialize_cache(self, num_blocks: int, sleep_memory=None) -> None:
        attn = self._attn
        shape = (2, num_blocks, self.block_size, attn.num_kv_heads, attn.head_dim)
        self.kv_caches = kv_zeros(sleep_memory, self.num_layers, shape, self.dtype, self.device)

    def capture(self, sizes: list[int], max_num_seqs: int) -> None:
        """Capture CUDA graphs (none: every forward runs eagerly, each hundreds of launches):
        the one-token forwards at the target's decode batch sizes, and the forwards over a
        step's tokens and the sampled one (2 to k + 2 a request) in mixed graphs of up to
        (k + 2) x the largest of those sizes, at most MIXED_MAX tokens."""
        if not sizes:
            return
        mixed = [s for s in piecewise_sizes(min((self.k + 2) * max(sizes), MIXED_MAX)) if s > 1]
        self.graphs = CUDAGraphRunner(self.model.forward, self.backend, self.kv_caches, sizes,
                                      cdiv(self.max_model_len, self.block_size),
                                      self.max_model_len,
                                      self.device, mixed, max_num_seqs, name="draft model")
        with self._group():
            self.graphs.capture()

    @torch.inference_mode()
    def launch(self, states, reqs: list, counts: list[int], batch: StepBatch,
               tokens: torch.Tensor | None) -> torch.Tensor | None:
        """Queue the draft model's forwards for a step right behind the step's own kernels,
        before anything is read back (module docstring). reqs, counts: the step's requests
        (their num_computed_tokens still the step's first position) and scheduled tokens;
        tokens: each sampling request's tokens on the device, [S] or (with drafts) [S, K + 1]
        with -1 past them. Returns [S, k] drafts on the device, -1 past each request's room;
        None where no request samples."""
        with self._group():
            return self._launch(states, reqs, counts, batch, tokens)

    def _launch(self, states, reqs, counts, batch, tokens) -> torch.Tensor | None:
        bs, n_req = self.block_size, len(reqs)
        counts = np.asarray(counts, dtype=np.int64)
        starts = np.asarray([r.num_computed_tokens for r in reqs], dtype=np.int64)
        limit = np.minimum([len(r.block_ids) * bs for r in reqs], self.max_model_len)
        sampling = np.asarray(batch.sample_rows, dtype=np.int64)
        drafted = batch.spec.counts if batch.spec is not None else np.zeros(len(sampling),
                                                                             np.int64)
        # Each sampling request's feed has one slot more, for the token it samples (where
        # its blocks hold that position: else it has no room to draft anyway).
        extra = np.zeros(n_req, dtype=np.int64)
        extra[sampling] = starts[sampling] + counts[sampling] < limit[sampling]
        fed = counts + extra
        fq = np.concatenate([[0], np.cumsum(fed)])
        req_of = np.repeat(np.arange(n_req), fed)
        at = np.arange(fq[-1]) - fq[req_of]
        qstart = batch.attn_metadata.query_start_loc_cpu.numpy()
        src = np.where(at < counts[req_of], qstart[req_of] + at, 0)
        rows = np.asarray([r.row for r in reqs], dtype=np.int64)
        # The sampled token's place in the feed, less the accepted drafts (known on the
        # device only), and the place past the request's feed (a row for nothing).
        base = fq[sampling] + counts[sampling] - drafted
        ends = fq[sampling + 1]
        first = starts[sampling] + counts[sampling] - drafted  # its position, likewise
        table_s = states.blocks[rows[sampling], :cdiv(int(limit.max()), bs)].astype(np.int32)
        meta, positions_d, (src_d, base_d, ends_d, first_d, limit_d, table_d) = self._prepare(
            states, rows, starts[req_of] + at, fq, starts + fed,
            [np.append(src, 0), base, ends, first, limit[sampling], table_s])
        ids = batch.input_ids[src_d]  # (and a last row for nothing)
        total = int(fq[-1])
        if tokens is None:
            self._run(StepBatch(ids[:total], positions_d, meta, [], None))
            return None
        tokens = tokens.reshape(len(sampling), -1)
        kept = (tokens >= 0).sum(dim=1) - 1  # accepted drafts
        place = base_d + kept
        place = torch.where(place < ends_d, place, total)
        ids[place] = tokens.gather(1, kept.unsqueeze(1)).squeeze(1)
        hidden = self._run(StepBatch(ids[:total], positions_d, meta, [], None))
        out = torch.empty((len(sampling), self.k), dtype=torch.long, device=self.device)
        out[:, 0] = cur = self._argmax(hidden[place.clamp(max=total - 1)])
        # Draft j is fed at first + kept + j, where the request's blocks hold it; a row past
        # its room attends to one key of its first block and writes nothing.
        last = first_d + kept  # the sampled token's position
        room = (limit_d - last).clamp(min=0, max=self.k)
        j = torch.arange(1, self.k, device=self.device).unsqueeze(1)
        live = j < room
        pos = torch.where(live, last + j, 0)
        block = table_d[torch.arange(len(sampling), device=self.device), pos // bs]
        slots = torch.where(live, block * bs + pos % bs, -1)
        seq = (pos + 1).to(torch.int32)
        # Known on the device only: a graph's metadata (fixed-shape, its bounds the model's),
        # whether or not a graph replays it.
        n = len(sampling)
        one_token = AttentionMetadata(
            num_actual_tokens=n, num_reqs=n, max_query_len=1, max_seq_len=self.max_model_len,
            query_start_loc=torch.arange(n + 1, dtype=torch.int32, device=self.device),
            seq_lens=None, block_table=table_d, slot_mapping=None,  # (each forward's own)
            query_start_loc_cpu=torch.arange(n + 1, dtype=torch.int32),
            seq_lens_cpu=torch.ones(n, dtype=torch.int32), fixed_shape=True)
        for step in range(self.k - 1):
            meta = dataclasses.replace(one_token, seq_lens=seq[step], slot_mapping=slots[step])
            out[:, step + 1] = cur = self._argmax(self._run(StepBatch(cur, pos[step], meta,
                                                                     [], None)))
        return torch.where(torch.arange(self.k, device=self.device) < room.unsqueeze(1), out, -1)

    def _argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.compute_logits(hidden)
        if logits.shape[1] > self.vocab:
            logits = logits[:, :self.vocab].contiguous()
        return greedy_argmax(logits.float())  # (the sampler's kernel on CUDA)

    def _prepare(self, states, rows: np.ndarray, positions: np.ndarray, qstart: np.ndarray,
                 seq_lens: np.ndarray, extra: list[np.ndarray]) -> tuple:
        """A forward's metadata over the paged cache: rows (of `states`' block table) with
        queries at qstart and lengths seq_lens. Returns it, the positions and the `extra`
        arrays on the device: every host array goes up in one copy from pinned memory, which
        does not wait for the forwards before it (a host array made a device tensor
        directly would)."""
        req_of_row = np.repeat(np.arange(len(rows)), np.diff(qstart))
        width = cdiv(int(seq_lens.max()), self.block_size)
        table = states.blocks[rows, :width]
        slots = (table[req_of_row, positions // self.block_size] * self.block_size
                 + positions % self.block_size)
        qstart32, seq32 = qstart.astype(np.int32), seq_lens.astype(np.int32)
        host = [positions.astype(np.int64), slots, qstart32, seq32, table.astype(np.int32)]
        positions_d, slots_d, qstart_d, seq_d, table_d, *extra_d = upload(host + extra,
                                                                          self.device)
        meta = AttentionMetadata(
            num_actual_tokens=int(qstart[-1]), num_reqs=len(rows),
            max_query_len=int(np.diff(qstart).max()), max_seq_len=int(seq_lens.max()),
            query_start_loc=qstart_d, seq_lens=seq_d, block_table=table_d,
            slot_mapping=slots_d, query_start_loc_cpu=torch.from_numpy(qstart32),
            seq_lens_cpu=torch.from_numpy(seq32))
        return meta, positions_d, extra_d

    def _run(self, batch: StepBatch) -> torch.Tensor:
        if self.graphs is not None:
            if (size := self.graphs.padded_size(batch)) is not None:
                return self.graphs.run(batch, size)
            if (size := self.graphs.mixed_size(batch)) is not None:
                return self.graphs.run_mixed(batch, size)
        with forward_context(ForwardContext(batch.attn_metadata, self.kv_caches, self.backend)):
            return self.model(batch.input_ids, batch.positions)
