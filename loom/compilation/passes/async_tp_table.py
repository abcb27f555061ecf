"""When to fuse a collective with its matmul: measured token-count thresholds.

PyTorch's fused collective matmuls pipeline the communication in TP-size chunks; at small
M the chunks are too short to hide anything and the extra launches and copies make them
slower than NCCL + cuBLAS. "Never slower" means fusing only from a measured crossover up,
per TP size and model width. Rows are keyed (tp_size, hidden_size); a shape with no row
uses the default row and the pass logs that it did.
"""

from __future__ import annotations

from dataclasses import dataclass

from loom import envs


@dataclass(frozen=True)
class Thresholds:
    all_gather_matmul: int
    """Fuse all_gather -> matmul from this many (gathered) tokens up."""
    matmul_reduce_scatter: int
    """Fuse matmul -> reduce_scatter from this many (pre-scatter) tokens up."""
    source: str
    """Where the numbers come from."""


MEASURED: dict[tuple[int, int], Thresholds] = {
    # Fused all_gather+matmul 0.74x at M=2048 and 0.91x at M=8192: unfused up to 8192
    # inclusive. matmul+reduce_scatter 0.75x at 2048, 1.02x at 8192: fused from 8192.
    (2, 4096): Thresholds(all_gather_matmul=8192 + 1, matmul_reduce_scatter=8192,
                          source="issue 5: 2x H200, Llama-3.1-8B TP=2 shapes, bf16"),
}
DEFAULT_KEY = (2, 4096)


@dataclass(frozen=True)
class Choice:
    fuse_all_gather: bool
    fuse_reduce_scatter: bool
    reason: str
    """For the log line: which row or override decided."""


def choose(tp_size: int, hidden_size: int, num_tokens: int) -> Choice:
    override = envs.async_tp_min_tokens()
    if override is not None:
        return Choice(num_tokens >= override, num_tokens >= override,
                      f"LOOM_ASYNC_TP_MIN_TOKENS={override}")
    row = MEASURED.get((tp_size, hidden_size))
    reason = f"table row TP={tp_size} hidden={hidden_size}"
    if row is None:
        row = MEASURED[DEFAULT_KEY]
        reason = (f"no measured row for TP={tp_size} hidden={hidden_size}; default row "
                  f"TP={DEFAULT_KEY[0]} hidden={DEFAULT_KEY[1]}")
    reason += (f": all_gather+matmul from {row.all_gather_matmul}, "
               f"matmul+reduce_scatter from {row.matmul_reduce_scatter} tokens")
    return Choice(num_tokens >= row.all_gather_matmul, num_tokens >= row.matmul_reduce_scatter,
                  reason)


def cache_state() -> str:
    """What the choice depends on besides the graph, for the compile-cache key."""
    return repr((sorted(MEASURED.items()), envs.async_tp_min_tokens()))
