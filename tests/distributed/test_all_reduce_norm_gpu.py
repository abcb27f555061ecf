"""The one-kernel all-reduce + residual add + RMSNorm over symmetric memory, on 2 GPUs,
against NCCL's all-reduce followed by the eager reference norm: every row count the fused
path takes and the fallback beyond it, float32 and bfloat16, many calls in a row (the
flag counters), and replays of a captured CUDA graph; rows pulled from the peers' buffers
(the default), pushed into them (LOOM_AR_NORM_PUSH=1) or handed over as words carrying
their epoch (LOOM_AR_NORM_LL=1, 16-bit rows). Both ranks must agree bit for bit,
since each computes the residual stream the next layer reads."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]


def _check(rank: int, port: int, out_dir: str) -> None:
    import torch.distributed as dist

    from loom.distributed import ops
    from loom.distributed.parallel_state import destroy_distributed, init_distributed
    from loom.layers.norm import fused_add_rms_norm
    torch.cuda.set_device(rank)
    init_distributed(2, rank, f"tcp://127.0.0.1:{port}", "nccl")
    device = torch.device("cuda", rank)
    failures = []
    try:
        assert ops.init_small_all_reduce("tp", torch.bfloat16, device)
        fused_op = torch.ops.loom.all_reduce_add_rms_norm

        def expect(x, residual, weight):
            reduced = x.clone()
            dist.all_reduce(reduced)
            return fused_add_rms_norm(reduced, residual, weight, 1e-5)

        def compare(tag, got, want, exact_residual=True):
            out, res = got
            ref_out, ref_res = want
            tol = 0 if exact_residual else 1e-2
            if not torch.allclose(res, ref_res, rtol=tol, atol=tol):
                failures.append(f"{tag}: residual off by {(res - ref_res).abs().max().item()}")
            if not torch.allclose(out.float(), ref_out.float(), rtol=1e-2, atol=1e-2):
                failures.append(f"{tag}: output off by {(out - ref_out).abs().max().item()}")
            both = [torch.empty_like(out) for _ in range(2)]
            dist.all_gather(both, out.contiguous())
            if not torch.equal(both[0], both[1]):
                failures.append(f"{tag}: ranks disagree")

        gen = torch.Generator(device).manual_seed(rank)
        shared = torch.Generator(device).manual_seed(100)
        for dtype in (torch.bfloat16, torch.float32):
            for rows in (1, 2, 7, 64, 65, 300):  # 65 and 300 take the fallback
                for width in (4096, 1000):
                    x = torch.randn(rows, width, device=device, dtype=dtype, generator=gen)
                    residual = torch.randn(rows, width, device=device, dtype=dtype,
                                           generator=shared)
                    weight = torch.rand(width, device=device, dtype=dtype, generator=shared)
                    compare(f"{dtype} {rows}x{width}", fused_op(x, residual, weight, 1e-5, "tp"),
                            expect(x, residual, weight), exact_residual=dtype == torch.float32)
        # Many calls in a row, rows changing: a miscounted flag deadlocks or mixes rows.
        xs = [torch.randn(r, 4096, device=device, dtype=torch.bfloat16, generator=gen)
              for r in [1, 3, 1, 8, 2] * 40]
        residual = torch.randn(8, 4096, device=device, dtype=torch.bfloat16, generator=shared)
        weight = torch.rand(4096, device=device, dtype=torch.bfloat16, generator=shared)
        outs = [fused_op(x, residual[:len(x)], weight, 1e-5, "tp") for x in xs]
        for i in (0, 77, 199):
            compare(f"call {i}", outs[i], expect(xs[i], residual[:len(xs[i])], weight), False)
        # A captured CUDA graph of three chained sites, replayed with fresh inputs.
        static_x = torch.zeros(1, 4096, device=device, dtype=torch.bfloat16)
        static_res = torch.zeros(1, 4096, device=device, dtype=torch.bfloat16)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            h, r = static_x, static_res
            for _ in range(3):
                h, r = fused_op(h, r, weight, 1e-5, "tp")
        for step in range(5):
            static_x.copy_(torch.randn(1, 4096, device=device, dtype=torch.bfloat16, generator=gen))
            static_res.copy_(torch.randn(1, 4096, device=device, dtype=torch.bfloat16,
                                         generator=shared))
            want_h, want_r = static_x, static_res
            graph.replay()
            for _ in range(3):
                want_h, want_r = expect(want_h, want_r, weight)
            compare(f"graph replay {step}", (h, r), (want_h, want_r), False)
        torch.cuda.synchronize()
    finally:
        destroy_distributed()
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(failures))


@pytest.mark.parametrize("protocol", ["pull", "push", "ll"])
def test_fused_all_reduce_norm_matches_nccl_and_reference(protocol, tmp_path, monkeypatch):
    # The spawned ranks inherit these. With LL, float32 rows keep the pull kernel.
    monkeypatch.setenv("LOOM_AR_NORM_PUSH", "1" if protocol == "push" else "0")
    monkeypatch.setenv("LOOM_AR_NORM_LL", "1" if protocol == "ll" else "0")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_check, args=(port, str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        assert (tmp_path / f"rank{rank}.txt").read_text() == "", f"rank {rank}"
