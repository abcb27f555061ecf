"""Start-up warm-up: the step shapes a fresh server meets first, each run once before it
serves.

Triton compiles a kernel on its first launch (hundreds of milliseconds for attention) and
CUDA loads kernel modules lazily. The compile run at start-up skips attention and CUDA
graph capture only covers pure decodes. So, without this, the first requests paid those
costs: in the H200 serving sweep at 94c6b95 the first five requests at 2 QPS had TTFTs of
0.1-0.9 s against a median of 32 ms, and the 1000-prompt burst stalled 2.4 s after its
first token. Each shape below takes one path a real step takes through the attention
backend, then the sampler's main paths run once on the driver.

Nothing is written: every slot is -1, so the KV cache is left as it was. Reads go to
block 0, whatever it holds.
"""

from __future__ import annotations

import contextlib
import logging
import time
from itertools import accumulate

import torch

from loom.attention.backend import AttentionMetadata
from loom.compilation import piece_graph
from loom.forward_context import ForwardContext, forward_context
from loom.kernels.compile_pool import compile_pool
from loom.kernels.host import cdiv, next_power_of_2
from loom.sampling_params import SamplingParams
from loom.worker.cuda_graph import piecewise_sizes
from loom.worker.sampler import SamplingMetadata

logger = logging.getLogger(__name__)

SDPA_SHAPE = "one fresh prompt through SDPA"
BESIDE_A_DECODE, DECODE_LEN = "a prompt beside a decode", 40
EAGER_DECODES = "a decode batch outside CUDA graphs"
STEP_SHAPES: list[tuple[str, list[int], list[int]]] = [
    # (what it covers, query tokens per request, sequence length per request)
    ("one fresh prompt", [37], [37]),
    # SDPA takes only long fresh prompts; the shape runs with its threshold lifted, so that
    # the kernels of that path (rotary writing the keys out for SDPA) compile here too.
    (SDPA_SHAPE, [37], [37]),
    (BESIDE_A_DECODE, [1, 37], [DECODE_LEN, 37]),  # one launch by default (see split_shape)
    ("five fresh prompts", [9] * 5, [9] * 5),
    ("a prompt chunk after cached context", [16], [48]),
    # Short contexts take one split (the decode kernel writes the output itself); a longer
    # one takes several, merged by their last program: each is its own kernel variant.
    ("a decode batch split along its keys", [1, 1], [129, 17]),
    # Last: 3 rows to sample. Its first layer also compiles every variant that decodes
    # outside CUDA graphs can take (`eager_decode_variants`), with its own arguments.
    (EAGER_DECODES, [1, 1, 1], [40, 17, 5]),
]

LOGITS_ROWS = 16
"""The LM head is warmed up at 1 .. this many rows: the decode GEMV's limit (gemv.MAX_M)."""

SAMPLING: list[list[SamplingParams]] = [
    # Each batch takes its own path through the sampler, each a kernel variant of its own:
    [SamplingParams(temperature=0.0)] * 2,  # all greedy
    [SamplingParams(temperature=1.0)] * 2,  # temperature only (throughput's)
    [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8)],  # the two mixed
    # top-p / top-k and logprobs: the torch path
    [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_p=0.9, top_k=20,
                                                     logprobs=2)],
]


def step_metadata(query_lens: list[int], seq_lens: list[int], num_tokens: int,
                  block_size: int, device: torch.device) -> AttentionMetadata:
    """Metadata of a step whose requests all read block 0 and write nowhere."""
    starts = torch.tensor([0, *accumulate(query_lens)], dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    blocks = -(-max(seq_lens) // block_size)
    return AttentionMetadata(
        num_actual_tokens=sum(query_lens), num_reqs=len(query_lens),
        max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        query_start_loc=starts.to(device), seq_lens=lens.to(device),
        block_table=torch.zeros(len(query_lens), blocks, dtype=torch.int32, device=device),
        slot_mapping=torch.full((num_tokens,), -1, dtype=torch.long, device=device),
        query_start_loc_cpu=starts, seq_lens_cpu=lens)


def step_positions(query_lens: list[int], seq_lens: list[int], num_tokens: int) -> torch.Tensor:
    """Each request's query tokens are the last of its sequence; padding rows get 0."""
    positions = torch.zeros(num_tokens, dtype=torch.long)
    row = 0
    for q, s in zip(query_lens, seq_lens):
        positions[row:row + q] = torch.arange(s - q, s)
        row += q
    return positions


def run_step(runner, query_lens: list[int], seq_lens: list[int], num_tokens: int,
             times: int = 1) -> torch.Tensor:
    """The runner's forward over a step of these requests (`step_metadata`, padded to
    num_tokens rows), run `times` times; returns the last run's hidden states."""
    meta = step_metadata(query_lens, seq_lens, num_tokens, runner.block_size, runner.device)
    positions = step_positions(query_lens, seq_lens, num_tokens).to(runner.device)
    ids = torch.zeros(num_tokens, dtype=torch.long, device=runner.device)
    with forward_context(ForwardContext(meta, runner.kv_caches, runner.backend)):
        for _ in range(times):
            out = runner.forward(ids, positions)
    return out


def split_shape(runner) -> list[tuple[str, list[int], list[int]]]:
    """The shape of a mixed step the attention backend splits (decodes to the split-K
    kernel, the prompt to the varlen kernel, each over a list of request indices: kernel
    variants of their own) where "a prompt beside a decode" is not split: enough decodes,
    if the batch holds them, else one decode as long as the split's context threshold (if
    the model's length reaches it). Without it those variants compiled at the first such
    step, stalling it 1.8 s (a served 10 QPS run on an H200, run_zzz12)."""
    backend = runner.backend
    splits = getattr(backend, "splits_mixed", None)
    if splits is None or splits(1, DECODE_LEN):
        return []  # a backend that never splits, or BESIDE_A_DECODE is split
    decodes, context = backend.mixed_split_min_decodes, backend.mixed_split_min_context
    if decodes + 1 <= runner.requests.tokens.shape[0]:
        return [(f"a prompt beside {decodes} decodes (split)", [1] * decodes + [37],
                 [DECODE_LEN] * decodes + [37])]
    if context <= runner.requests.tokens.shape[1]:
        return [(f"a prompt beside a {context}-token decode (split)", [1, 37], [context, 37])]
    return []


@torch.inference_mode()
def warm_up(runner) -> None:
    """Run STEP_SHAPES through the runner's forward (every rank, in the same order: the
    forward's collectives need them all) and SAMPLING through the driver's sampler."""
    if not runner.kv_caches or runner.kv_caches[0].shape[1] == 0:
        return
    start = time.perf_counter()
    phases = _Phases(runner.device)
    max_len = runner.requests.tokens.shape[1]  # max_model_len
    multiple = runner.token_multiple
    shapes = [s for s in STEP_SHAPES + split_shape(runner) if max(s[2]) <= max_len]
    eager = eager_decode_variants(runner) if any(s[0] == EAGER_DECODES for s in shapes) else []
    hidden = None  # the widest step's
    for name, query_lens, seq_lens in shapes:
        n = -(-sum(query_lens) // multiple) * multiple
        with _shape_context(runner, name, eager):
            out = run_step(runner, query_lens, seq_lens, n)
        if hidden is None or out.shape[0] > hidden.shape[0]:
            hidden = out
    phases.done("step shapes")
    variants = warm_up_mixed_decodes(runner)
    phases.done("mixed decodes")
    sdpa_lengths = warm_up_sdpa(runner) if runner.device.type == "cuda" else []
    phases.done("SDPA")
    if hidden is not None and hasattr(runner.model, "lm_head"):  # a classifier samples nothing
        # The LM head runs eagerly, after the forward and its CUDA graphs: on the GEMV its
        # row count is a constexpr, and each count of requests in a step (up to the GEMV's
        # limit) compiled a variant of its own at its first step (run_zzs). Compiled side
        # by side first, then run one by one.
        row_counts = range(1, min(LOGITS_ROWS, hidden.shape[0]) + 1)
        compile_logits_gemv(runner, [hidden[:rows] for rows in row_counts])
        for rows in row_counts:
            runner.model.compute_logits(hidden[:rows])
        phases.done("LM head")
        rows = min(max(len(batch) for batch in SAMPLING), hidden.shape[0])
        logits = runner.model.compute_logits(hidden[:rows]).float()
        for params in SAMPLING if runner.is_driver else []:
            params = params[:rows]
            meta = SamplingMetadata.build(params, [[] for _ in params], [[] for _ in params],
                                          [set() for _ in params], [None] * len(params),
                                          runner.device, runner.arch.vocab_size)
            runner.sampler(logits[:len(params)].clone(), meta)  # sampling may write logits
    phases.done("sampler")
    logger.info("warm-up: %d step shapes (%s), %d decode kernel variants of decodes outside "
                "CUDA graphs and %d of mixed steps, SDPA at %d lengths and the sampler in "
                "%.1f s (%s)", len(shapes), ", ".join(s[0] for s in shapes), len(eager),
                len(variants), len(sdpa_lengths),
                time.perf_counter() - start, phases)


def _shape_context(runner, name: str, eager: list[tuple[int, int, int, int]]):
    """What a step shape runs under: SDPA_SHAPE with SDPA at any length; EAGER_DECODES
    compiling the `eager` decode variants at its first layer."""
    if name == SDPA_SHAPE:
        return sdpa_at_any_length(runner.backend)
    if name == EAGER_DECODES:
        return runner.backend.compiling_decodes(eager)
    return contextlib.nullcontext()


class _Phases:
    """Seconds per phase of the warm-up, each ended on the device (start-up on an H200 took
    16 s of warm-up at fe61b90 against 4.5-5 s at 07a738d, run_zzz5: which phase?)."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.last, self.seconds = device, time.perf_counter(), {}

    def done(self, name: str) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.seconds[name], self.last = now - self.last, now

    def __str__(self) -> str:
        return ", ".join(f"{name} {s:.1f}" for name, s in self.seconds.items()) + " s"


def plan_pieces(runner) -> list[int]:
    """The token counts batches are padded up to for piecewise CUDA graphs (the runner's
    piece_sizes; [] where none are captured, said in one line)."""
    cfg = runner.config
    pieces = piecewise_sizes(cfg.scheduler.max_num_batched_tokens)
    multiple = runner.token_multiple
    if cfg.compilation.cudagraph_mode == "PIECEWISE" and \
            cfg.compilation.cudagraph_capture_sizes is not None:
        pieces = sorted({cdiv(s, multiple) * multiple
                         for s in cfg.compilation.cudagraph_capture_sizes})
        if not pieces:
            logger.info("cudagraph_mode PIECEWISE with no cudagraph_capture_sizes: no batch "
                        "replays CUDA graphs")
            return []
    if not runner.forward.capture_pieces_at(pieces):
        logger.info("cudagraph_mode %s: piecewise CUDA graphs need level 3 with the graph "
                    "split at attention (here level %d%s); %s", cfg.compilation.cudagraph_mode,
                    runner.forward.level, ", one whole graph" if runner.forward.level == 3
                    else "", "batches of more tokens replay no CUDA graphs"
                    if cfg.compilation.cudagraph_mode == "FULL" else
                    "only decode batches replay CUDA graphs" if cfg.compilation.decode_graphs
                    else "no batch replays CUDA graphs")
        return []
    # compile_sizes in that range are padding targets too: their static graphs.
    sizes = sorted(set(pieces).union(s for s in cfg.compilation.compile_sizes
                                     if s <= pieces[-1]))
    logger.info("piecewise CUDA graphs: batches of up to %d tokens that no decode graph "
                "takes are padded to %s tokens", pieces[-1], sizes)
    return sizes


@torch.inference_mode()
def capture_pieces(runner) -> None:
    """Capture the piecewise CUDA graphs of every size batches are padded to (each size's
    pieces are captured on its second run), so that no request waits for one: captured as
    they came, the first requests of a 10 QPS sweep had TTFTs of 0.18-0.38 s against a
    mean of 33 ms (run_zzz8). Each size runs as fresh prompts of up to max_model_len tokens
    that write nowhere and read block 0."""
    sizes = runner.piece_sizes
    if not sizes or not runner.kv_caches:
        return
    start = time.perf_counter()
    before = piece_graph.reserved()
    max_len = runner.requests.tokens.shape[1]
    with piece_graph.quiet():
        # Largest first: the pool's blocks that a size frees are split for smaller sizes; in
        # the other order each larger size needs blocks of its own (1.16 GB for 8B, run_zzz9).
        for n in reversed(sizes):
            query_lens = [max_len] * (n // max_len) + ([n % max_len] if n % max_len else [])
            run_step(runner, query_lens, query_lens, n, times=2)
    logger.info("piecewise CUDA graphs: the pieces captured at %d sizes (%d .. %d tokens) in "
                "%.1f s, %.2f GB more GPU memory reserved", len(sizes), sizes[0], sizes[-1],
                time.perf_counter() - start, (piece_graph.reserved() - before) / 1e9)


def compile_logits_gemv(runner, inputs: list[torch.Tensor]) -> None:
    """Compile the LM head's decode GEMV for each of inputs on threads, running nothing
    (CUDA only: the interpreter compiles nothing). A compile that fails here is dropped:
    the head's first run compiles it again, in line."""
    head = getattr(runner.model, "lm_head", None)
    if runner.device.type != "cuda" or head is None:
        return
    with compile_pool(len(inputs), ignore_errors=True):
        for x in inputs:
            head.compile_logits(x)


@contextlib.contextmanager
def sdpa_at_any_length(backend):
    """For the block, the (Triton) backend's SDPA takes fresh prompts of any length."""
    threshold, backend.sdpa_min_tokens = backend.sdpa_min_tokens, 0
    try:
        yield
    finally:
        backend.sdpa_min_tokens = threshold


def warm_up_sdpa(runner) -> list[int]:
    """SDPA at every padded length a fresh prompt can take (one per SDPA_BUCKET up to a
    step's tokens), so that cuDNN has built each one's graph before the first such prompt."""
    from loom.layers.attention import Attention
    attn = next(m for m in runner.model.modules() if isinstance(m, Attention))
    kv_cache = runner.kv_caches[0]
    max_tokens = min(runner.config.scheduler.max_num_batched_tokens,
                     runner.requests.tokens.shape[1])
    return runner.backend.warm_up_sdpa(attn.num_heads, kv_cache.shape[3], kv_cache.shape[4],
                                       runner.dtype, runner.device, attn.scale, max_tokens)


def decode_variants(backend, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                    batches: range, max_model_len: int, cache_dtype: torch.dtype | None = None,
                    mixed: bool = False) -> list[tuple[int, int, int, int]]:
    """The (block_n, num_warps, num_stages, num_splits) the decode kernel can take for
    decode batches of `batches` requests over a cache of cache_dtype (None: dtype), one
    num_splits per compiled variant: the kernel is compiled per (block_n, num_warps,
    num_stages, SPLITS_PAD), SPLITS_PAD being the next power of two of num_splits that
    sizes the splits' merge (1: one split, no merge). mixed: the decodes of mixed steps
    (prompt chunks beside them), only where the backend splits them from the chunks."""
    seen: dict[tuple[int, int, int, int], int] = {}
    lens = {min(2 ** i, max_model_len) for i in range(max_model_len.bit_length() + 1)}
    if mixed and backend.mixed_split_min_context <= max_model_len:
        lens.add(backend.mixed_split_min_context)  # fewer decodes split from there on
    for num_reqs in batches:
        tiles = backend.decode_tiles(num_reqs, num_kv_heads, head_dim, dtype, cache_dtype)
        block_n, warps, stages = tiles
        for seq_len in sorted(lens):
            if mixed and not backend.splits_mixed(num_reqs, seq_len):
                continue  # one launch: no decode kernel
            splits = backend.decode_splits(num_reqs, num_kv_heads, seq_len, tiles,
                                           cache_dtype or dtype)
            pad = 1 if splits == 1 else next_power_of_2(splits)  # SPLITS_PAD
            seen.setdefault((block_n, warps, stages, pad), splits)
    return sorted((bn, w, st, splits) for (bn, w, st, _), splits in seen.items())


def eager_decode_variants(runner) -> list[tuple[int, int, int, int]]:
    """`decode_variants` of the pure decode batches that run outside CUDA graphs: of every
    size under --enforce-eager (or with no decode graphs), else of those larger than the
    largest graph. Their contexts grow as they go, so their splits change from step to step;
    under --enforce-eager three such variants compiled mid-run, 1.3-4.4 s each (8B over an
    fp8 cache, run_zzz54)."""
    sizes = runner.decode_graph_sizes()
    batches = range(max(sizes) + 1 if sizes else 1,
                    (runner.config.scheduler.max_num_seqs or 1) + 1)
    kv_cache = runner.kv_caches[0]
    return decode_variants(runner.backend, kv_cache.shape[3], kv_cache.shape[4], runner.dtype,
                           batches, runner.requests.tokens.shape[1], kv_cache.dtype)


def warm_up_mixed_decodes(runner) -> list[tuple[int, int, int, int]]:
    """Compile the decode kernel once per variant `decode_variants` names for mixed steps,
    side by side on threads, with the arguments of one request reading block 0 (nothing
    runs). A mixed step's decodes number anywhere from one to max_num_seqs and their
    contexts grow as they go, so its splits (and tiles) change from step to step; each new
    variant compiled mid-run stalled a step 0.2-0.7 s on an H200 (throughput's first steps,
    run_zzn). One after another they added 4.7 s to 8B's start-up (run_zzo)."""
    from loom.kernels.paged_decode import paged_decode
    backend, kv_cache = runner.backend, runner.kv_caches[0]
    cfg = runner.config
    num_kv_heads, head_dim = kv_cache.shape[3], kv_cache.shape[4]
    num_heads = runner.arch.num_heads // cfg.parallel.tensor_parallel_size
    max_len = runner.requests.tokens.shape[1]
    variants = decode_variants(backend, num_kv_heads, head_dim, runner.dtype,
                               range(1, (cfg.scheduler.max_num_seqs or 1) + 1), max_len,
                               kv_cache.dtype, mixed=True)
    device = runner.device
    query = torch.zeros(1, num_heads, head_dim, dtype=runner.dtype, device=device)
    out = torch.empty_like(query)
    starts = torch.tensor([0, 1], dtype=torch.int32, device=device)
    req_index = torch.zeros(1, dtype=torch.int32, device=device)
    with compile_pool(len(variants)):  # compiled side by side, nothing run
        for block_n, warps, stages, splits in variants:
            seq_len = min(max_len, splits * block_n)
            blocks = -(-seq_len // runner.block_size)
            block_table = torch.zeros(1, blocks, dtype=torch.int32, device=device)
            seq_lens = torch.tensor([seq_len], dtype=torch.int32, device=device)
            paged_decode(query, kv_cache, out, block_table, starts, seq_lens, 1, 1.0, splits,
                         block_n=block_n, num_warps=warps, num_stages=stages,
                         req_index=req_index, compile_only=True)
    return variants
