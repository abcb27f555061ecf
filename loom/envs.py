"""Every LOOM_* environment variable, typed, in one place.

Each is read when asked for (a function, not a module constant), so a test or a launcher
that sets one before starting a process is seen by that process.
"""

from __future__ import annotations

import os
from pathlib import Path


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}: expected a number, got {raw!r}") from None


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def allow_runtime_lora_updating() -> bool:
    """LOOM_ALLOW_RUNTIME_LORA_UPDATING=1 (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING): `loom
    serve --enable-lora` adds POST /v1/load_lora_adapter and /v1/unload_lora_adapter (one
    API server)."""
    return _flag("LOOM_ALLOW_RUNTIME_LORA_UPDATING")


def enable_responses_api_store() -> bool:
    """LOOM_ENABLE_RESPONSES_API_STORE=1 (vLLM's VLLM_ENABLE_RESPONSES_API_STORE):
    /v1/responses keeps responses in each API server's memory (bounded, least recently used
    out) for previous_response_id and GET /v1/responses/{id}; without it `store` is off."""
    return _flag("LOOM_ENABLE_RESPONSES_API_STORE")


def server_dev_mode() -> bool:
    """LOOM_SERVER_DEV_MODE=1 (vLLM's VLLM_SERVER_DEV_MODE): `loom serve` adds the
    development routes (/sleep, /wake_up, /is_sleeping, /collective_rpc,
    /reset_prefix_cache), which no end user should reach."""
    return _flag("LOOM_SERVER_DEV_MODE")


def api_key() -> str | None:
    """LOOM_API_KEY: the server's API key when --api-key is not given."""
    return os.environ.get("LOOM_API_KEY") or None


def cache_dir() -> Path:
    """LOOM_CACHE_DIR: where converted tokenizers are cached (default ~/.cache/loom)."""
    root = os.environ.get("LOOM_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "loom"


def log_stats_interval_s() -> float:
    """LOOM_LOG_STATS_INTERVAL: seconds between the engine's periodic stats lines (10)."""
    return _float("LOOM_LOG_STATS_INTERVAL", 10.0)


def engine_dead_linger_s() -> float:
    """LOOM_ENGINE_DEAD_LINGER_S: how long an API server keeps answering (503 on /health,
    errors elsewhere) after its engine died, before it exits non-zero (2)."""
    return _float("LOOM_ENGINE_DEAD_LINGER_S", 2.0)


def engine_start_timeout_s() -> float:
    """LOOM_ENGINE_START_TIMEOUT_S: the longest an engine core may take to load (1800)."""
    return _float("LOOM_ENGINE_START_TIMEOUT_S", 1800.0)


def test_introspection() -> bool:
    """LOOM_TEST_INTROSPECTION=1: the API server adds GET /_loom/introspect (asyncio task
    count, live request streams, engine request and KV-block counts) for tests."""
    return _flag("LOOM_TEST_INTROSPECTION")


def async_tp_min_tokens() -> int | None:
    """LOOM_ASYNC_TP_MIN_TOKENS: fuse collective matmuls (async TP) from this token count
    up, overriding the measured per-shape table; for measuring the fused ops (unset)."""
    return _optional_int("LOOM_ASYNC_TP_MIN_TOKENS")


def sp_min_tokens() -> int | None:
    """LOOM_SP_MIN_TOKENS: apply sequence parallelism (and with it async TP) to graphs of
    this many tokens and up, and to the dynamic graph, overriding the measured per-shape
    table; for measuring, and for tests on tiny models (unset)."""
    return _optional_int("LOOM_SP_MIN_TOKENS")


def _optional_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw!r}") from None


def sampler_kernel() -> bool:
    """LOOM_SAMPLER_KERNEL: 0 turns off loom's Triton greedy/temperature sampling kernels
    on CUDA (`loom/kernels/sampling.py`), for comparing against PyTorch's ops."""
    return _on_unless_zero("LOOM_SAMPLER_KERNEL")


def _on_unless_zero(name: str) -> bool:
    return os.environ.get(name, "1") != "0"


SDPA_MIN_TOKENS = 2048


def sdpa_min_tokens() -> int:
    """LOOM_SDPA_MIN_TOKENS: fresh prefills of fewer tokens take loom's paged prefill kernel
    rather than PyTorch's SDPA on the Triton backend (default SDPA_MIN_TOKENS; 0: SDPA
    whatever the size). On an H200 (run_zzt, 8B) the kernel's one-prompt steps took 20-24
    against SDPA's 39-41 ms up to 777 tokens, were even at 1501-3001 and 5-12% slower at
    6007-12011."""
    value = _optional_int("LOOM_SDPA_MIN_TOKENS")
    return SDPA_MIN_TOKENS if value is None else value


MIXED_SPLIT_MIN_DECODES = 16
"""On an H200 (run_zzz10, 8B, 10 QPS of 550-token prompts, about ten decodes a mixed step)
one launch took the prompt step from 23.1 / 23.2 to 17.7 / 17.5 ms (median, two runs each):
the host's time a layer fell from 0.61 to 0.40 ms, the kernels' 14.35 to 14.15 ms a step.
Throughput's mixed steps (hundreds of decodes) keep the split, 1.9-2.2x faster there."""

MIXED_SPLIT_MIN_CONTEXT = 1024
"""One launch walks each decode's keys in one program, with no split along them: beside a
550-token prompt (run_zzz14, one 8B layer) it matched the split at 700-token contexts up to
16 decodes (the split 0.86-0.93x as fast) but lost from 2000 on at any count (the split
1.5-2.1x as fast at 2000, 2.0-3.1x at 4000, 2.1-5.1x at 8000)."""


def decode_tiles() -> tuple[int, int, int] | None:
    """LOOM_DECODE_TILES=block_n,num_warps,num_stages: the split-K decode kernel's tiles
    for every decode, overriding the backend's choice; for measuring (unset)."""
    raw = os.environ.get("LOOM_DECODE_TILES", "").strip()
    if not raw:
        return None
    try:
        block_n, warps, stages = (int(v) for v in raw.split(","))
    except ValueError:
        raise ValueError("LOOM_DECODE_TILES: expected block_n,num_warps,num_stages "
                         f"(e.g. 64,2,3), got {raw!r}") from None
    if block_n < 16 or block_n & (block_n - 1) or warps < 1 or warps & (warps - 1) \
            or stages < 1:
        raise ValueError(f"LOOM_DECODE_TILES: block_n must be a power of two of at least 16 "
                         f"(tl.dot's least), num_warps a power of two, num_stages positive; "
                         f"got {raw!r}")
    return block_n, warps, stages


def decode_splits() -> int | None:
    """LOOM_DECODE_SPLITS=N: every split-K decode takes N splits per (request, KV head)
    (1-32), overriding the backend's choice; for measuring (unset)."""
    value = _optional_int("LOOM_DECODE_SPLITS")
    if value is not None and not 1 <= value <= 32:
        raise ValueError(f"LOOM_DECODE_SPLITS: expected 1 to 32 splits, got {value}")
    return value


def mixed_split_min_decodes() -> int:
    """LOOM_MIXED_SPLIT_MIN_DECODES: a mixed step (prompt chunks beside one-token decodes)
    sends its decodes to the split-K decode kernel and its chunks to the varlen kernel in
    two launches from this many decodes (or from LOOM_MIXED_SPLIT_MIN_CONTEXT); otherwise
    one varlen launch serves them all (decodes as one-row queries). Default
    MIXED_SPLIT_MIN_DECODES."""
    value = _optional_int("LOOM_MIXED_SPLIT_MIN_DECODES")
    return MIXED_SPLIT_MIN_DECODES if value is None else value


def mixed_split_min_context() -> int:
    """LOOM_MIXED_SPLIT_MIN_CONTEXT: a mixed step is split, whatever its number of decodes,
    where its longest decode reads at least this many tokens. Default
    MIXED_SPLIT_MIN_CONTEXT."""
    value = _optional_int("LOOM_MIXED_SPLIT_MIN_CONTEXT")
    return MIXED_SPLIT_MIN_CONTEXT if value is None else value


def all_reduce_norm_push() -> bool:
    """LOOM_AR_NORM_PUSH=1: the fused all-reduce + norm kernel writes its row into every
    peer's buffer (posted NVLink stores) and sums from its own, instead of writing its own
    buffer and reading every peer's (a remote read's round trip on the critical path). An
    experiment for TP decode, off by default until measured (docs/performance.md)."""
    return os.environ.get("LOOM_AR_NORM_PUSH", "0") == "1"


def all_reduce_norm_ll() -> bool:
    """LOOM_AR_NORM_LL=1: the fused all-reduce + norm kernel hands rows over as 8-byte words
    of two 16-bit values and the call's epoch (NCCL's "low latency" protocol,
    `kernels/all_reduce_norm_ll.py`): no fences or counters between the ranks. An
    experiment for TP decode, off until measured on 2 GPUs (session 25)."""
    return _flag("LOOM_AR_NORM_LL")


def symm_all_reduce_max_bytes() -> int:
    """LOOM_SYMM_ALL_REDUCE_MAX_BYTES: on CUDA with TP > 1, all-reduces up to this size go
    through a one-shot kernel over symmetric memory instead of NCCL (1 MiB; 0 = NCCL
    always)."""
    return int(_float("LOOM_SYMM_ALL_REDUCE_MAX_BYTES", float(1 << 20)))


def async_tp_impl() -> str:
    """LOOM_ASYNC_TP_IMPL: what the async-TP pass fuses collectives with their matmuls into.
    "p2p" (default): at TP=2, loom's lean ops over symmetric memory (loom/distributed/
    p2p_matmul.py; one barrier a call), at the static-graph sites where the measured table
    says fusing wins; at other TP sizes and inside CUDA graph captures they fall back to
    "symm_mem"'s ops. "symm_mem": PyTorch's fused_all_gather_matmul, and its pipelined
    exchange of matmul partials in place of fused_matmul_reduce_scatter (the sum left to
    Inductor), at the same sites. On 2x H200 at 8192 tokens p2p's step was 0.9 ms faster
    (docs/passes.md). "overlap": loom's loom::all_gather_matmul / loom::matmul_reduce_scatter
    (loom/distributed/collective_matmul.py), every graph, overlapped from
    LOOM_ASYNC_TP_MIN_TOKENS (1024)."""
    value = os.environ.get("LOOM_ASYNC_TP_IMPL", "") or "p2p"
    if value not in ASYNC_TP_IMPLS:
        raise ValueError(f"LOOM_ASYNC_TP_IMPL: expected one of {', '.join(ASYNC_TP_IMPLS)}, "
                         f"got {value!r}")
    return value


ASYNC_TP_IMPLS = ("symm_mem", "p2p", "overlap")


def torch_profiler_dir() -> str | None:
    """LOOM_TORCH_PROFILER_DIR (vLLM's VLLM_TORCH_PROFILER_DIR): where `LLM.start_profile()`
    / `stop_profile()` and the server's POST /start_profile, /stop_profile write each
    profile (a folder per profile: every rank's torch.profiler trace and op table). Unset:
    the calls are refused and the routes absent, as in vLLM."""
    value = os.environ.get("LOOM_TORCH_PROFILER_DIR", "").strip()
    return os.path.abspath(os.path.expanduser(value)) if value else None


def torch_profiler_with_stack() -> bool:
    """LOOM_TORCH_PROFILER_WITH_STACK=1 (vLLM's VLLM_TORCH_PROFILER_WITH_STACK): the
    profiler of `loom bench ... --profile` records Python frames too (a larger, slower
    trace; `benchmarks/gpu/trace_gaps.py` sums the GPU's idle time by them)."""
    return _flag("LOOM_TORCH_PROFILER_WITH_STACK")


def layer_times() -> bool:
    """LOOM_LAYER_TIMES=1: for every step run eagerly on CUDA, log each layer's host time
    beside its GPU time (CUDA events at each attention call), to tell a host-bound step
    from a GPU-bound one without a profiler's own host cost (loom/worker/layer_clock.py)."""
    return _flag("LOOM_LAYER_TIMES")


def moe_align_torch() -> bool:
    """LOOM_MOE_ALIGN_TORCH=1: the fused MoE sorts its slots with torch ops (~15 kernels)
    instead of its two Triton kernels; a fallback while the Triton align is new."""
    return _flag("LOOM_MOE_ALIGN_TORCH")


def decode_rope_unfused() -> bool:
    """LOOM_DECODE_ROPE_UNFUSED=1: a pure decode step rotates and writes the new tokens in
    their own kernel before the Triton decode attention, rather than inside it; a fallback
    while the fused path is new."""
    return _flag("LOOM_DECODE_ROPE_UNFUSED")


def fast_launch() -> bool:
    """LOOM_FAST_LAUNCH (on unless 0): launch Triton kernels outside CUDA graphs through
    loom/kernels/launch.py, which skips most of Triton's per-call host work after a kernel's
    first launch of each specialization. On since its GPU tests passed (run_zzz70); 0 gives
    every launch to Triton's `kernel[grid]`, for comparing against it."""
    return _on_unless_zero("LOOM_FAST_LAUNCH")


def short_query_decode() -> bool:
    """LOOM_SHORT_QUERY_DECODE (on unless 0): queries of a few tokens (a speculative
    step's verify, up to `mixed_split.SHORT_QUERY_TOKENS`) take the split-K decode
    kernel; 0 gives them the varlen prefill kernel, as before, for comparing."""
    return _on_unless_zero("LOOM_SHORT_QUERY_DECODE")


def pdl() -> bool:
    """LOOM_PDL=1: loom's decode kernels (GEMV, decode attention, all-reduce + norm) launch
    with programmatic dependent launch on sm_90+ GPUs (loom/kernels/pdl.py). Off by
    default: 1-GPU decode measured 4.44 against 4.34 ms/token without it (run_zk)."""
    return _flag("LOOM_PDL")


def pdl_prefetch_bytes() -> int:
    """LOOM_PDL_PREFETCH_MB: with LOOM_PDL=1, how much of its weight a GEMV asks into L2
    before its predecessor finishes, in MiB (0: none, the default; 24 made 1-GPU decode
    5.50 ms/token against 4.44 without: run_zk)."""
    return int(_float("LOOM_PDL_PREFETCH_MB", 0.0) * (1 << 20))


def decode_gemv() -> bool:
    """LOOM_DECODE_GEMV: at level 3, decode-size matmuls of a weight take loom's Triton
    GEMV where a measured config exists (loom/compilation/passes/decode_gemv.py). On by
    default where CUDA is (1-GPU decode on an H200: 4.59 -> 4.30 ms/token); 0 turns it off,
    1 turns it on without CUDA too (the CPU has no measured configs: F.linear throughout)."""
    value = os.environ.get("LOOM_DECODE_GEMV", "").strip().lower()
    if value:
        return value in ("1", "true", "yes", "on")
    import torch
    return torch.cuda.is_available()


def decode_norm_gemv() -> bool:
    """LOOM_DECODE_NORM_GEMV (on unless 0): with the decode GEMV at TP=1, the residual add
    + RMSNorm before qkv and gate_up is applied by the GEMV as it reads its input, with the
    row tile `kernels/gemv_decode.norm_config` finds (the gemv_norm table, else the plain
    table's tile where it reduces rows unsplit; elsewhere loom's add + norm kernel, then
    the GEMV). On an H200 at batch 1, 128 -> 128, alternated in one call: qkv alone
    (run_zzz26) one TP=2 rank's shapes 2.499 / 2.457 against 2.546 / 2.545 ms/token off,
    Llama-3.1-8B 4.300 / 4.359 against 4.348 / 4.353; with the gemv_norm table, gate_up
    too (run_zzz27), 8B 4.115 against 4.361."""
    value = os.environ.get("LOOM_DECODE_NORM_GEMV", "").strip().lower()
    return value not in ("0", "false", "no", "off")


GC_THRESHOLDS = (50_000, 20, 100)
"""The engine's collector thresholds once it has started. Python's (700, 10, 10) ran ~2100
young and ~17 full collections in one 1000-request throughput run on an H200, 2 s in all:
a full one traverses every live request's token lists (a reference per token, ~10^7),
60-120 ms each, a step stalled behind it (run_zzp). Per-step objects die young; the engine
makes no cyclic garbage in a run (benchmarks/gpu/gc_probe.py), so rarer collections lose
nothing."""


def gc_thresholds() -> tuple[int, int, int]:
    """LOOM_GC_THRESHOLDS: "g0,g1,g2", the engine's gc.set_threshold after start-up
    (default GC_THRESHOLDS; "700,10,10" is Python's own)."""
    raw = os.environ.get("LOOM_GC_THRESHOLDS", "").strip()
    if not raw:
        return GC_THRESHOLDS
    try:
        values = tuple(int(v) for v in raw.split(","))
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 1:
        raise ValueError(f"LOOM_GC_THRESHOLDS: expected three positive integers "
                         f"\"g0,g1,g2\", got {raw!r}")
    return values
