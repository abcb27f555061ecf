"""The partition probe's persistent GEMM (benchmarks/gpu/persistent_gemm.py) against torch's
matmul: partial tiles at both edges, a strided a, fewer programs than tiles."""
import importlib.util
from pathlib import Path

import pytest
import torch

spec = importlib.util.spec_from_file_location(
    "persistent_gemm", Path(__file__).parents[2] / "benchmarks/gpu/persistent_gemm.py")
pg = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pg)

SMALL = pg.Tiles(block_m=32, block_n=32, block_k=32, group_m=2, num_stages=1, num_warps=4)
DTYPE = torch.bfloat16 if torch.cuda.is_available() else torch.float16  # numpy has no bf16


@pytest.mark.parametrize("m,n,k,programs", [(80, 96, 64, 5), (32, 32, 32, 1), (70, 64, 96, 64)])
def test_matches_torch(m, n, k, programs):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(m * n + programs)
    wide = torch.randn(m, k + 32, generator=g).to(dev, DTYPE)
    a = wide[:, 16:16 + k]  # rows k + 32 apart, as a slice of a fused qkv output is
    b = torch.randn(n, k, generator=g).to(dev, DTYPE)
    out = torch.full((m, n), float("nan"), device=dev, dtype=DTYPE)
    pg.persistent_mm(a, b, programs, SMALL, out=out)
    ref = a.float() @ b.float().t()
    assert torch.allclose(out.float(), ref, atol=0.05, rtol=0.02)


def test_bad_shapes_and_programs_are_named():
    a, b = torch.zeros(4, 8, dtype=DTYPE), torch.zeros(4, 16, dtype=DTYPE)
    with pytest.raises(ValueError, match="a is"):
        pg.persistent_mm(a, b, 1, SMALL)
    with pytest.raises(ValueError, match="programs"):
        pg.persistent_mm(a, a, 0, SMALL)
