"""The GEMV's tiles (`GemvConfig`), its default choice and the checks of its arguments
(`kernels/gemv.py` has the kernel and its launch)."""

from __future__ import annotations

import dataclasses

import torch

from loom.kernels.host import cdiv, is_power_of_2

MAX_M = 16
"""Most rows per call: one tensor-core tile's worth (`use_dot` pads the rows to 16), so
that up to here the GEMV costs what one row's tile does; beyond, a GEMM's tiles are the
right tool."""

SPLIT_MODES = ("fixup", "reduce", "atomic")


@dataclasses.dataclass(frozen=True)
class GemvConfig:
    block_n: int = 16
    block_k: int = 256
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    split_mode: str = "fixup"
    use_dot: bool = False

    def describe(self) -> str:
        split = f" split{self.split_k}-{self.split_mode}" if self.split_k > 1 else ""
        return (f"bn{self.block_n} bk{self.block_k} w{self.num_warps} s{self.num_stages}"
                f"{' dot' if self.use_dot else ''}{split}")


def default_config(m: int, n: int, k: int) -> GemvConfig:
    """A starting point, not a measured table: 16-row blocks, 256-wide chunks, and a split
    of K when the row blocks alone would give fewer than two programs per H200 SM."""
    block_n, block_k = 16, 256
    blocks = cdiv(n, block_n)
    split_k = 1
    while blocks * split_k < 264 and split_k < 4 and k % (2 * split_k * block_k) == 0:
        split_k *= 2
    return GemvConfig(block_n=block_n, block_k=block_k, num_warps=4, num_stages=3,
                      split_k=split_k, split_mode="fixup", use_dot=m > 4)


def _check_config(cfg: GemvConfig, k: int) -> None:
    # A slice of K past its end (split_k * block_k not dividing K) is masked: correct,
    # only a wasted program; the benchmark keeps to dividing splits.
    if not (is_power_of_2(cfg.block_n) and is_power_of_2(cfg.block_k)):
        raise ValueError(f"gemv: block_n and block_k must be powers of two, got {cfg}")
    if cfg.use_dot and (cfg.block_n < 16 or cfg.block_k < 16):
        raise ValueError(f"gemv: use_dot needs block_n >= 16 and block_k >= 16, got {cfg}")
    if cfg.num_warps not in (1, 2, 4, 8, 16) or cfg.num_stages < 1:
        raise ValueError(f"gemv: bad num_warps / num_stages in {cfg}")
    if cfg.split_k < 1:
        raise ValueError(f"gemv: split_k must be >= 1, got {cfg.split_k}")
    if cfg.split_mode not in SPLIT_MODES:
        raise ValueError(f"gemv: split_mode must be one of {SPLIT_MODES}, got "
                         f"{cfg.split_mode!r}")
    if cfg.split_k > k:
        raise ValueError(f"gemv: split_k={cfg.split_k} exceeds K={k}")


def prefetch_bytes(cfg: GemvConfig, block_k: int, n: int, k: int, itemsize: int,
                   budget: int) -> int:
    """What each row of a program's slab asks into L2 before a PDL wait: whole BLOCK_K
    chunks, so that the programs together ask for about `budget` bytes of the weight (all of
    it if smaller). 0 where a slice of K would run past its row (an uneven split) or a row
    does not start 16-byte aligned, as the bulk prefetch needs."""
    k_split = -(-k // (cfg.split_k * block_k)) * block_k
    if budget <= 0 or k_split * cfg.split_k != k or (k * itemsize) % 16:
        return 0
    k_iters = k_split // block_k
    chunks = min(k_iters, -(-k_iters * budget // (n * k * itemsize)))
    return chunks * block_k * itemsize


def _check_inputs(x: torch.Tensor, weight: torch.Tensor, silu_mul_input: bool,
                  weight_scale: torch.Tensor | None) -> tuple[int, int, int]:
    """gemv's argument checks; returns (M, K, N)."""
    if x.dim() != 2 or weight.dim() != 2:
        raise ValueError(f"gemv: expected x [M, K] and weight [N, K], got {tuple(x.shape)} "
                         f"and {tuple(weight.shape)}")
    m, kx = x.shape
    n, k = weight.shape
    if not 1 <= m <= MAX_M:
        raise ValueError(f"gemv: x must have 1 to {MAX_M} rows, got {m}")
    if kx != (2 * k if silu_mul_input else k):
        want = f"2 * {k} ([gate | up])" if silu_mul_input else f"{k}"
        raise ValueError(f"gemv: x has {kx} columns, expected {want} for weight "
                         f"{tuple(weight.shape)}")
    if n == 0 or k == 0:
        raise ValueError(f"gemv: empty weight {tuple(weight.shape)}")
    w_dtypes = (x.dtype,) if weight_scale is None else (torch.float8_e4m3fn, torch.int8)
    if weight.dtype not in w_dtypes or x.dtype not in (torch.bfloat16, torch.float16,
                                                       torch.float32):
        raise ValueError(f"gemv: x and weight must share a dtype among bfloat16, float16 "
                         f"and float32 (or weight float8_e4m3fn or int8 with a "
                         f"weight_scale), got {x.dtype} and {weight.dtype}")
    if weight_scale is not None and (
            weight_scale.dtype != torch.float32 or weight_scale.numel() != n
            or not weight_scale.is_contiguous() or weight_scale.device != x.device):
        raise ValueError(f"gemv: weight_scale must be a contiguous float32 tensor of {n} "
                         f"values (one per row of weight) on {x.device}, got "
                         f"{tuple(weight_scale.shape)} {weight_scale.dtype}")
    if not (x.is_contiguous() and weight.is_contiguous()):
        raise ValueError("gemv: x and weight must be contiguous")
    if x.device != weight.device:
        raise ValueError(f"gemv: x on {x.device}, weight on {weight.device}")
    return m, k, n


def _resolve_config(config: GemvConfig | dict | None, m: int, n: int, k: int) -> GemvConfig:
    """config as gemv takes it (None: `default_config`), checked against K."""
    if config is None:
        config = default_config(m, n, k)
    elif isinstance(config, dict):
        config = GemvConfig(**config)
    _check_config(config, k)
    return config
