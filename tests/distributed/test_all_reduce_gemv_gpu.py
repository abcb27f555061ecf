"""The decode GEMV that all-reduces its own input (LOOM_GEMV_ALL_REDUCE=1), on 2 GPUs over
symmetric memory, against NCCL's all-reduce followed by loom's add + norm and the
product: `loom.decode_all_reduce_add_rms_norm_linear` at 1, 2 and 8 rows, many calls over
several sites in a row, and replays of a captured CUDA graph of chained sites. Both ranks
must agree bit for bit (each computes the residual stream the next layer reads)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]

WIDTH, N = 4096, 3072


def _check(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    import loom.kernels.gemv_decode as gemv_decode
    from loom.distributed import ops
    from loom.distributed.parallel_state import destroy_distributed, init_distributed
    from loom.kernels.gemv import GemvConfig
    from loom.layers.norm import fused_add_rms_norm
    torch.cuda.set_device(rank)
    init_distributed(2, rank, f"tcp://127.0.0.1:{port}", "nccl")
    device, dtype = torch.device("cuda", rank), torch.bfloat16
    failures = []
    try:
        assert ops.init_small_all_reduce("tp", dtype, device, WIDTH, 8)
        assert ops.gemv_exchange("tp") is not None
        # Every row count fused (the H200's tables stop at 2 rows); row tiles.
        gemv_decode.norm_config = lambda m, n, k, dtype, device: GemvConfig(block_n=16,
                                                                             block_k=512)
        op = torch.ops.loom.decode_all_reduce_add_rms_norm_linear
        gen = torch.Generator(device).manual_seed(rank)
        shared = torch.Generator(device).manual_seed(100)
        weights = [torch.randn(N, WIDTH, device=device, dtype=dtype, generator=shared) / 64
                   for _ in range(3)]
        norm_w = (1 + 0.1 * torch.randn(WIDTH, device=device, generator=shared)).to(dtype)

        def expect(x, residual, w):
            reduced = x.clone()
            dist.all_reduce(reduced)
            normed, res = fused_add_rms_norm(reduced, residual, norm_w, 1e-5)
            return normed.double() @ w.double().T, res

        def compare(tag, got, x, residual, w):
            y, res = got
            want, want_res = expect(x, residual, w)
            err = ((y.double() - want).norm() / want.norm()).item()
            if err > 1.5e-2:
                failures.append(f"{tag}: off by {err:.3g}")
            if not torch.equal(res, want_res):
                failures.append(f"{tag}: residual differs")
            both = [torch.empty_like(y) for _ in range(2)]
            dist.all_gather(both, y.contiguous())
            if not torch.equal(both[0], both[1]):
                failures.append(f"{tag}: ranks disagree")

        calls = []
        for i in range(60):  # sites by weight, rows changing
            rows = (1, 2, 8)[i % 3]
            x = torch.randn(rows, WIDTH, device=device, dtype=dtype, generator=gen)
            residual = torch.randn(rows, WIDTH, device=device, dtype=dtype, generator=shared)
            w = weights[i % 3]
            calls.append((op(x, residual, norm_w, 1e-5, w, "tp"), x, residual, w))
        for i in (0, 1, 2, 31, 59):
            compare(f"call {i}", *calls[i])
        x = torch.zeros(1, WIDTH, device=device, dtype=dtype)
        residual = torch.zeros(1, WIDTH, device=device, dtype=dtype)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [op(x, residual, norm_w, 1e-5, w, "tp") for w in weights]
        for step in range(5):
            x.copy_(torch.randn(1, WIDTH, device=device, dtype=dtype, generator=gen))
            residual.copy_(torch.randn(1, WIDTH, device=device, dtype=dtype, generator=shared))
            graph.replay()
            for site, w in enumerate(weights):
                compare(f"replay {step} site {site}", outs[site], x, residual, w)
        torch.cuda.synchronize()
    finally:
        destroy_distributed()
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(failures))


def test_all_reducing_gemv_matches_nccl_and_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_GEMV_ALL_REDUCE", "1")  # the spawned ranks inherit it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_check, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "", f"rank {rank}"
