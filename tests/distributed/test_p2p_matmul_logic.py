"""The CUDA path of loom's p2p collective matmuls, its exchange logic on the CPU: two
threads play the two ranks, a threading barrier plays the symmetric-memory barrier, and
each rank's "symmetric buffer" is a tensor the other thread can read. Streams are no-ops
(the CPU runs each op in order), so what is checked is which slot, offset and rows each
rank writes and reads, over several calls in a row (the alternating slots), against the
plain collective's result. The GPU test (`test_collective_matmuls_on_gpu[p2p]`) runs the
real thing."""

from __future__ import annotations

import contextlib
import math
import threading

import pytest
import torch

from loom.distributed import p2p_matmul


class _FakeHandle:
    def __init__(self, rank: int, storages: list[torch.Tensor], barrier: threading.Barrier):
        self.rank, self.world_size = rank, 2
        self._storages, self._barrier = storages, barrier

    def get_buffer(self, rank, shape, dtype, storage_offset=0):
        flat = self._storages[rank].view(dtype)
        return flat[storage_offset:storage_offset + math.prod(shape)].view(shape)

    def barrier(self, channel=0):
        self._barrier.wait(timeout=30)


class _NoStream:
    def wait_stream(self, other):
        pass


@pytest.fixture
def two_ranks(monkeypatch):
    storages = [torch.full((1 << 16,), 255, dtype=torch.uint8) for _ in range(2)]
    barrier = threading.Barrier(2)
    local = threading.local()

    def workspace(group_name):
        if not hasattr(local, "ws"):
            ws = p2p_matmul._Workspace(group=None)
            ws.handle = _FakeHandle(local.rank, storages, barrier)
            ws.slot_bytes = storages[0].numel() // 4
            ws.stream = _NoStream()
            local.ws = ws
        return local.ws

    monkeypatch.setattr(p2p_matmul, "_workspace", workspace)
    monkeypatch.setattr(p2p_matmul, "_path", lambda t, group_name: "lean")
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _NoStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())

    def run(fn_per_rank):
        results, errors = [None, None], []

        def body(rank):
            local.rank = rank
            try:
                results[rank] = fn_per_rank(rank)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                barrier.abort()
        threads = [threading.Thread(target=body, args=(r,)) for r in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return results
    return run


def test_all_gather_matmul_exchange(two_ranks):
    torch.manual_seed(0)
    calls = [(torch.randn(2, 4, 8), [torch.randn(8, 3), torch.randn(8, 5)], keep)
             for keep in (True, False, True)]  # three calls: both slots, then the first again

    def rank_calls(rank):
        return [p2p_matmul.all_gather_matmul_p2p(shards[rank], weights, 2, "tp", keep)
                for shards, weights, keep in calls]

    for rank, outs in enumerate(two_ranks(rank_calls)):
        for (shards, weights, keep), (gathered, products) in zip(calls, outs):
            full = torch.cat([shards[0], shards[1]])
            if keep:
                assert torch.equal(gathered, full)
            else:
                assert gathered.shape[0] == 0
            for w, got in zip(weights, products):
                torch.testing.assert_close(got, full @ w)


def test_matmul_reduce_scatter_partials_exchange(two_ranks):
    torch.manual_seed(1)
    b = torch.randn(8, 6)
    calls = [torch.randn(2, 10, 8) for _ in range(3)]  # each rank's a [10, 8], per call

    def rank_calls(rank):
        return [p2p_matmul.matmul_reduce_scatter_partials_p2p(a[rank], b, 2, "tp")
                for a in calls]

    for rank, outs in enumerate(two_ranks(rank_calls)):
        rows = slice(rank * 5, (rank + 1) * 5)
        for a, partials in zip(calls, outs):
            # partials[r]: rank r's a times b, for this rank's rows.
            expected = torch.stack([a[0][rows] @ b, a[1][rows] @ b])
            torch.testing.assert_close(partials, expected)


def test_a_cuda_graph_capture_takes_the_plain_path(monkeypatch, caplog):
    """The lean path picks its slot on the host, so a replay would reuse the capture's slot,
    and PyTorch's fused ops cannot grow their workspace inside a capture: inside one (a
    decode size in compile_sizes) the ops take NCCL collectives and plain matmuls, with one
    log line, rather than fail the capture."""
    class _Cuda:
        is_cuda, shape = True, (12, 8)

    class _Group:
        world_size = 2

    monkeypatch.setattr(p2p_matmul, "get_group", lambda name: _Group())
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    assert p2p_matmul._path(_Cuda(), "tp") == "lean"
    _Group.world_size = 4
    assert p2p_matmul._path(_Cuda(), "tp") == "fused"
    capturing[0] = True
    caplog.set_level("INFO", logger="loom.distributed.p2p_matmul")
    monkeypatch.setattr(p2p_matmul, "_announced_capture", [])
    for world_size in (2, 4):
        _Group.world_size = world_size
        assert p2p_matmul._path(_Cuda(), "tp") == "plain"
    assert caplog.text.count("the graph records NCCL collectives and plain matmuls") == 1
