"""When to fuse a collective with its matmul: measured token-count thresholds.

PyTorch's fused collective matmuls pipeline the communication in TP-size chunks; at small
M the chunks are too short to hide anything and the extra launches and copies make them
slower than NCCL + cuBLAS. "Never slower" means fusing only from a measured crossover up,
per TP size and model width. Rows are keyed (tp_size, hidden_size); a shape with no row
uses the default row and the pass logs that it did.

Sequence parallelism itself has a row too: on 2x H200 (94c6b95) it made a 2048-token
prefill 1.53x slower with nothing fused, so it applies only to static graphs from a
measured token count up, and to the dynamic graph (which serves every other count, decode
included) only where a row says so. Where it applies to no graph of a config, the
config compiles as if it were off (`PassManager.plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

from loom import envs


@dataclass(frozen=True)
class Thresholds:
    sequence_parallelism: int
    """Apply sequence parallelism (and so async TP) to static graphs from this many tokens."""
    dynamic_graph: bool
    """Whether the dynamic graph takes sequence parallelism."""
    all_gather_matmul: int
    """Fuse all_gather -> matmul from this many (gathered) tokens up."""
    matmul_reduce_scatter: int
    """Fuse matmul -> reduce_scatter from this many (pre-scatter) tokens up."""
    source: str
    """Where the numbers come from."""


MEASURED: dict[tuple[int, int], Thresholds] = {
    # Whole 8192-token prefills (benchmarks/results/h200x2-tp2-asynctp-8192-dd79e7c, two
    # interleaved runs each): off 127.5 ms; reduce-scatters fused alone 127.4 ms (0.999x);
    # all-gathers fused too 122.3 ms (0.959x). So both fuse from 8192. Sequence parallelism
    # made a 2048-token prefill 1.53x slower with nothing fused
    # (h200x2-tp2-asynctp-table-94c6b95), and the dynamic graph with loom's overlap ops was
    # 1.014x at 8192, so SP starts at 8192 and the dynamic graph stays without.
    (2, 4096): Thresholds(sequence_parallelism=8192, dynamic_graph=False,
                          all_gather_matmul=8192, matmul_reduce_scatter=8192,
                          source="issue 5: 2x H200, Llama-3.1-8B TP=2 shapes, bf16"),
}
DEFAULT_KEY = (2, 4096)


@dataclass(frozen=True)
class Choice:
    fuse_all_gather: bool
    fuse_reduce_scatter: bool
    reason: str
    """For the log line: which row or override decided."""


@dataclass(frozen=True)
class SequenceParallelChoice:
    apply: bool
    reason: str


def _row(tp_size: int, hidden_size: int) -> tuple[Thresholds, str]:
    row = MEASURED.get((tp_size, hidden_size))
    if row is not None:
        return row, f"table row TP={tp_size} hidden={hidden_size}"
    return MEASURED[DEFAULT_KEY], (f"no measured row for TP={tp_size} hidden={hidden_size}; "
                                   f"default row TP={DEFAULT_KEY[0]} hidden={DEFAULT_KEY[1]}")


def sequence_parallel(tp_size: int, hidden_size: int,
                      num_tokens: int | None) -> SequenceParallelChoice:
    """Whether a graph of num_tokens tokens (None: the dynamic graph) takes sequence
    parallelism."""
    override = envs.sp_min_tokens()
    if override is not None:
        return SequenceParallelChoice(num_tokens is None or num_tokens >= override,
                                      f"LOOM_SP_MIN_TOKENS={override}")
    row, reason = _row(tp_size, hidden_size)
    reason += (f": static graphs from {row.sequence_parallelism} tokens, dynamic graph "
               f"{'yes' if row.dynamic_graph else 'no'}")
    apply = row.dynamic_graph if num_tokens is None else num_tokens >= row.sequence_parallelism
    return SequenceParallelChoice(apply, reason)


def choose(tp_size: int, hidden_size: int, num_tokens: int) -> Choice:
    override = envs.async_tp_min_tokens()
    if override is not None:
        return Choice(num_tokens >= override, num_tokens >= override,
                      f"LOOM_ASYNC_TP_MIN_TOKENS={override}")
    row, reason = _row(tp_size, hidden_size)
    reason += (f": all_gather+matmul from {row.all_gather_matmul}, "
               f"matmul+reduce_scatter from {row.matmul_reduce_scatter} tokens")
    return Choice(num_tokens >= row.all_gather_matmul, num_tokens >= row.matmul_reduce_scatter,
                  reason)


def cache_state() -> str:
    """What the choices depend on besides the graph, for the compile-cache key."""
    return repr((sorted(MEASURED.items()), envs.async_tp_min_tokens(), envs.sp_min_tokens()))
