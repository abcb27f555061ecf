"""A draft model's proposals for speculative decoding (vLLM's method "draft_model").

The draft model runs whole on the driver rank (under TP too: its proposals are the step's)
and keeps a paged KV cache of its own laid out like the target's: the same
block ids and slots, so one block table serves both, and a prefix-cache hit holds both
models' KV (the drafter computes every token the target keeps, in the same step).

Once a step's tokens are read back, the drafter runs its model eagerly:
  1. one forward over each request's tokens of the step that the target kept (drafts
     past the first rejection are not) and, where the request sampled, the token it
     sampled: their draft KV is written, and the last row's logits give the first draft;
  2. then one-token forwards, each feeding the draft before it and taking the next.
Where the target has decode graphs, both replay CUDA graphs (the first a mixed graph
holding up to MIXED_MAX tokens): eagerly, a 16-layer draft's forward is hundreds of
launches from Python (run_zzz116, H100: the drafter and verify step together cost ~23 ms a
step more than a plain decode while that first forward ran eagerly).
A draft is the draft model's argmax: a point mass, which `spec_verify` accepts or redraws
so that every output token is still drawn from the target. Drafts' KV goes into the
slots past the request's tokens, allocated for it by the scheduler
(`SpeculativeConfig.lookahead`); a request with fewer free slots gets fewer drafts. The
next step recomputes those positions in the target, and its drafter rewrites their KV
with the tokens kept.
"""

from __future__ import annotations

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

logger = logging.getLogger(__name__)


MIXED_MAX = 512
"""The largest mixed graph of kept tokens captured: a prompt's first forward, or a batch of
more than ~85 requests at k = 4, runs eagerly (its launches spread over more tokens)."""


def make_drafter(config: EngineConfig, target_vocab: int, max_model_len: int,
                 device: torch.device, backend: AttentionBackend,
                 is_driver: bool = True) -> Drafter | None:
    """The config's draft model, or None where it names none. Only the driver rank drafts
    (its proposals are the step's): under TP it holds the whole draft model beside its
    shard of the target, and the other ranks hold none."""
    spec = config.speculative
    if spec is None or spec.method != "draft_model" or not is_driver:
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
        # As vLLM's: the target's dtype and load format (dummy weights draft dummy ones).
        draft = ModelConfig(model=spec.model, dtype=config.model.dtype,
                            max_model_len=max_model_len, seed=config.model.seed,
                            load_format=config.model.load_format)
        start = time.perf_counter()
        try:
            with tp_alone():  # whole on the driver, whatever the target's TP size
                self.model, arch, self.dtype = load_model(
                    dataclasses.replace(config, model=draft, speculative=None, lora=None),
                    device)
        except (OSError, ValueError) as e:
            raise ValueError(f"speculative_config.model: {spec.model!r}: {e}") from None
        if getattr(self.model, "is_encoder", False) or not hasattr(self.model, "compute_logits"):
            raise ValueError(f"speculative_config.model: {spec.model!r} ({arch.architecture}) "
                             "is not a causal LM: a draft model must generate")
        if arch.context_len < max_model_len:
            raise ValueError(f"speculative_config.model: the draft model's context "
                             f"({arch.context_len} tokens) is shorter than max_model_len "
                             f"({max_model_len}); lower max_model_len")
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

    def initialize_cache(self, num_blocks: int) -> None:
        attn = self._attn
        shape = (2, num_blocks, self.block_size, attn.num_kv_heads, attn.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                          for _ in range(self.num_layers)]

    def capture(self, sizes: list[int], max_num_seqs: int) -> None:
        """Capture CUDA graphs (none: every forward runs eagerly, each hundreds of launches):
        the one-token forwards at the target's decode batch sizes, and the forwards over a
        step's kept tokens (2 to k + 2 a request) in mixed graphs of up to
        (k + 2) x the largest of those sizes, at most MIXED_MAX tokens."""
        if not sizes:
            return
        mixed = [s for s in piecewise_sizes(min((self.k + 2) * max(sizes), MIXED_MAX)) if s > 1]
        self.graphs = CUDAGraphRunner(self.model.forward, self.backend, self.kv_caches, sizes,
                                      cdiv(self.max_model_len, self.block_size),
                                      self.max_model_len,
                                      self.device, mixed, max_num_seqs, name="draft model")
        with tp_alone():
            self.graphs.capture()

    @torch.inference_mode()
    def propose(self, states, reqs: list, starts: list[int], ends: list[int],
                sampled: list[list[int]]) -> dict[str, list[int]]:
        """Drafts for each request that sampled a token this step (request id -> ids).
        starts / ends: per request, the position of its first token this step and the one
        past its last (its sampled tokens included, already in `states`' table)."""
        with tp_alone():
            return self._propose(states, reqs, starts, ends, sampled)

    def _propose(self, states, reqs, starts, ends, sampled) -> dict[str, list[int]]:
        jobs, room = [], []
        for r, s, e, out in zip(reqs, starts, ends, sampled):
            if states.get(r.req_id) is not r or len(r.token_ids) < e or e <= s:
                continue  # dropped or re-sent since its step was launched
            slots = len(r.block_ids) * self.block_size
            # Its sampled token is fed at e - 1 and each draft but the last after it: each
            # needs a slot (the scheduler allocated `lookahead` past the step's tokens).
            n = min(self.k, slots - e + 1) if out else 0
            jobs.append((r, s, e if n > 0 or not out else e - 1))
            room.append(max(n, 0))
        kept = [i for i, (_, s, e) in enumerate(jobs) if e > s]  # (a lone unfed token: none)
        jobs, room = [jobs[i] for i in kept], [room[i] for i in kept]
        if not jobs:
            return {}
        take = np.flatnonzero(np.asarray(room) > 0)
        hidden, ends_a, rows = self._feed(states, jobs, take)
        if not take.size:
            return {}
        n = np.asarray(room)[take]
        cur = self._argmax(hidden)
        out = torch.full((len(take), self.k), -1, dtype=torch.long, device=self.device)
        out[:, 0] = cur
        active, pos = np.arange(len(take)), ends_a[take]  # the first draft's position
        active_d = None  # (all rows, until some run out of room)
        for j in range(1, int(n.max())):
            keep = n[active] > j
            if not keep.all():
                keep_d, active_d = upload([np.flatnonzero(keep), active[keep]], self.device)
                cur, active = cur[keep_d], active[keep]
            at = pos[active] + j - 1  # draft j is fed here
            hidden = self._forward(states, rows[take[active]], at, np.arange(len(active) + 1),
                                   at + 1, cur)
            cur = self._argmax(hidden)
            out[slice(None) if active_d is None else active_d, j] = cur
        table = out.tolist()
        return {jobs[i][0].req_id: table[t][:n[t]] for t, i in enumerate(take.tolist())}

    def _feed(self, states, jobs: list, take: np.ndarray) -> tuple:
        """Write the draft KV of each job's tokens [start, end); return the hidden states of
        the last token of the jobs `take` indexes, and every job's end and table row."""
        rows = np.asarray([r.row for r, _, _ in jobs], dtype=np.int64)
        starts = np.asarray([s for _, s, _ in jobs], dtype=np.int64)
        ends = np.asarray([e for _, _, e in jobs], dtype=np.int64)
        counts = ends - starts
        req_of_row = np.repeat(np.arange(len(jobs)), counts)
        qstart = np.concatenate([[0], np.cumsum(counts)])
        positions = np.arange(qstart[-1]) - qstart[req_of_row] + starts[req_of_row]
        ids = states.tokens[rows[req_of_row], positions].astype(np.int64)
        hidden = self._forward(states, rows, positions, qstart, ends, ids, qstart[1:][take] - 1)
        return hidden, ends, rows

    def _argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.compute_logits(hidden)
        if logits.shape[1] > self.vocab:
            logits = logits[:, :self.vocab].contiguous()
        return greedy_argmax(logits.float())  # (the sampler's kernel on CUDA)

    def _forward(self, states, rows: np.ndarray, positions: np.ndarray, qstart: np.ndarray,
                 seq_lens: np.ndarray, ids: np.ndarray | torch.Tensor,
                 out_rows: np.ndarray | None = None) -> torch.Tensor:
        """One forward of the draft model over the paged cache (a decode graph's replay
        where one holds it, else eager): rows (of `states`' block table) with queries at
        qstart and lengths seq_lens; ids on the host, or the drafts before on the device.
        Its hidden states, or only those at out_rows. The host arrays go up in one copy
        from pinned memory, which does not wait for the forwards before it (a host array
        made a device tensor directly would)."""
        req_of_row = np.repeat(np.arange(len(rows)), np.diff(qstart))
        width = cdiv(int(seq_lens.max()), self.block_size)
        table = states.blocks[rows, :width]
        slots = (table[req_of_row, positions // self.block_size] * self.block_size
                 + positions % self.block_size)
        qstart32, seq32 = qstart.astype(np.int32), seq_lens.astype(np.int32)
        host = [positions.astype(np.int64), slots, qstart32, seq32, table.astype(np.int32)]
        on_host = isinstance(ids, np.ndarray)
        extra = ([ids] if on_host else []) + ([out_rows] if out_rows is not None else [])
        positions_d, slots_d, qstart_d, seq_d, table_d, *extra_d = upload(host + extra,
                                                                          self.device)
        meta = AttentionMetadata(
            num_actual_tokens=int(qstart[-1]), num_reqs=len(rows),
            max_query_len=int(np.diff(qstart).max()), max_seq_len=int(seq_lens.max()),
            query_start_loc=qstart_d, seq_lens=seq_d, block_table=table_d,
            slot_mapping=slots_d, query_start_loc_cpu=torch.from_numpy(qstart32),
            seq_lens_cpu=torch.from_numpy(seq32))
        hidden = self._run(StepBatch(extra_d[0] if on_host else ids, positions_d, meta, [],
                                     None))
        return hidden if out_rows is None else hidden[extra_d[-1]]

    def _run(self, batch: StepBatch) -> torch.Tensor:
        if self.graphs is not None:
            if (size := self.graphs.padded_size(batch)) is not None:
                return self.graphs.run(batch, size)
            if (size := self.graphs.mixed_size(batch)) is not None:
                return self.graphs.run_mixed(batch, size)
        with forward_context(ForwardContext(batch.attn_metadata, self.kv_caches, self.backend)):
            return self.model(batch.input_ids, batch.positions)
