"""A persistent Triton GEMM that runs on as many SMs as it is told: the piece an SM
partition of a mixed step needs (issue 3's throughput), which cuBLAS does not give
(run_zzz133: it ignored `torch._C._set_sm_carveout_experimental`).

`persistent_mm(a, b, programs)` is a @ b.T for a [M, K] and b [N, K] (K contiguous), with
`programs` programs, each walking the output tiles programs apart, grouped along M so that
neighbours share b's tiles in L2. Its tiles are loaded and stored through TMA descriptors
(Hopper); the interpreter runs it too (fp16 there: numpy has no bf16). A probe's kernel,
not the engine's: the loop bounds are constexpr, so each shape and program count compiles
once.
"""
import dataclasses

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@dataclasses.dataclass(frozen=True)
class Tiles:
    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_stages: int = 3
    num_warps: int = 8


@triton.jit
def _persistent_mm(a_desc, b_desc, c_desc, M, N, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, K_TILES: tl.constexpr,
                   ITERS: tl.constexpr, GROUP_M: tl.constexpr):
    pid, programs = tl.program_id(0), tl.num_programs(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    for i in range(ITERS):
        tile = pid + i * programs
        if tile < tiles_m * tiles_n:
            per_group = GROUP_M * tiles_n
            first_m = (tile // per_group) * GROUP_M
            rows = min(tiles_m - first_m, GROUP_M)
            m = first_m + (tile % per_group) % rows
            n = (tile % per_group) // rows
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for k in range(K_TILES):
                a = a_desc.load([m * BLOCK_M, k * BLOCK_K])
                b = b_desc.load([n * BLOCK_N, k * BLOCK_K])
                acc = tl.dot(a, b.T, acc)
            c_desc.store([m * BLOCK_M, n * BLOCK_N], acc.to(c_desc.dtype))


def persistent_mm(a: torch.Tensor, b: torch.Tensor, programs: int, tiles: Tiles = Tiles(),
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b.T on `programs` programs (at most one a tile, so never more than the tiles)."""
    (m, k), (n, k_b) = a.shape, b.shape
    if k != k_b:
        raise ValueError(f"persistent_mm: a is [{m}, {k}] but b is [{n}, {k_b}]")
    if programs < 1:
        raise ValueError(f"persistent_mm: programs must be >= 1, got {programs}")
    out = torch.empty(m, n, device=a.device, dtype=a.dtype) if out is None else out
    t = tiles
    total = triton.cdiv(m, t.block_m) * triton.cdiv(n, t.block_n)
    programs = min(programs, total)
    _persistent_mm[(programs,)](
        TensorDescriptor.from_tensor(a, [t.block_m, t.block_k]),
        TensorDescriptor.from_tensor(b, [t.block_n, t.block_k]),
        TensorDescriptor.from_tensor(out, [t.block_m, t.block_n]), m, n,
        BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
        K_TILES=triton.cdiv(k, t.block_k), ITERS=triton.cdiv(total, programs),
        GROUP_M=t.group_m, num_stages=t.num_stages, num_warps=t.num_warps)
    return out
