"""The fused all-reduce + residual add + RMSNorm's three hand-over protocols, both TP=2
ranks on one GPU at once (two streams), one 8 KB row (Llama-3.1-8B's decode at batch 1):

  pull: each rank writes its row into its own buffer, signals the peer (system-scope
        release), waits for the peer's signal, reads the peer's row, signals "read";
  push: each writes its row into the peer's buffer, the same two handshakes;
  ll:   LOOM_AR_NORM_LL=1, rows as 8-byte words of two values and the call's epoch, no
        fence or counter (kernels/all_reduce_norm_ll.py);
  one_rank: the same kernel with no peer (the add + norm alone), one stream.

Per protocol: one CUDA graph in which rank 0's CALLS calls run on one stream and rank 1's
on another, replayed REPLAYS times; microseconds a call (a pair of calls at once), median
and min. On one GPU the peer's memory is this GPU's: what is timed is each protocol's own
cost (its fences, handshakes and round trips on the GPU), not NVLink's latency, which
every protocol pays once or twice over on a real pair.

    python3 benchmarks/gpu/ar_norm_probe.py OUT.json
"""

import dataclasses
import json
import statistics
import sys

import torch

from loom.bench.ceilings import measure_ceilings
from loom.bench.common import git_commit, now_iso
from loom.kernels.all_reduce_norm import SymmetricNormBuffer, _launch, add_rms_norm
from loom.kernels.all_reduce_norm_ll import LowLatencyNormBuffer

WIDTH, ROWS, CALLS, REPLAYS, EPS = 4096, 1, 64, 20, 1e-5
MAX_ROWS, MAX_WIDTH = SymmetricNormBuffer.MAX_ROWS, SymmetricNormBuffer.MAX_WIDTH


def ranks_for(protocol, dev):
    """Two callables, rank 0's and rank 1's call(x, residual, weight)."""
    if protocol == "ll":
        words = LowLatencyNormBuffer.words(2, MAX_ROWS, MAX_WIDTH)
        bufs = [torch.zeros(words, dtype=torch.int64, device=dev) for _ in range(2)]
        ptrs = torch.tensor([b.data_ptr() for b in bufs], device=dev)
        ranks = [LowLatencyNormBuffer(r, 2, ptrs, MAX_ROWS, MAX_WIDTH) for r in range(2)]
        keep = bufs
        return [lambda x, res, w, r=r: ranks[r].all_reduce_add_rms_norm(x, res, w, EPS)
                for r in range(2)], keep
    push = protocol == "push"
    slot = SymmetricNormBuffer.BYTES
    data = [torch.zeros(slot * (2 if push else 1), dtype=torch.uint8, device=dev)
            for _ in range(2)]
    flags = [torch.zeros(2, 2, MAX_ROWS, dtype=torch.int32, device=dev) for _ in range(2)]
    for f in flags:
        f[1].fill_(1)  # every row "read": the first call does not wait
    data_ptrs = torch.tensor([d.data_ptr() for d in data], device=dev)
    flag_ptrs = torch.tensor([f.data_ptr() for f in flags], device=dev)
    return [lambda x, res, w, r=r: _launch(x, res, w, EPS, data_ptrs, flag_ptrs, r, 2,
                                           MAX_ROWS, push, slot)
            for r in range(2)], (data, flags)


def pair_us(calls, args):
    """Rank 0's and rank 1's calls at once on two streams, eagerly (warm-up) then as one
    CUDA graph; (median, min) microseconds a pair of calls."""
    streams = [torch.cuda.Stream() for _ in range(2)]
    for rank in range(2):  # rank 0 compiles; rank 1 reuses the binary (no load mid-spin)
        with torch.cuda.stream(streams[rank]):
            for _ in range(3):
                calls[rank](*args[rank])
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    main = torch.cuda.Stream()
    with torch.cuda.graph(graph, stream=main):
        streams[1].wait_stream(main)
        with torch.cuda.stream(streams[1]):
            for _ in range(CALLS):
                calls[1](*args[1])
        for _ in range(CALLS):
            calls[0](*args[0])
        main.wait_stream(streams[1])
    return replay_us(graph)


def replay_us(graph):
    """(median, min) microseconds a call over REPLAYS replays of a graph of CALLS calls."""
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / CALLS)
    return statistics.median(times), min(times)


def one_rank_us(x, res, w):
    for _ in range(3):
        add_rms_norm(x, res, w, EPS)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            add_rms_norm(x, res, w, EPS)
    return replay_us(graph)


def main() -> None:
    dev, dtype = torch.device("cuda"), torch.bfloat16
    ceil = measure_ceilings(dev)
    gen = torch.Generator(dev).manual_seed(0)
    xs = [torch.randn(ROWS, WIDTH, device=dev, dtype=dtype, generator=gen) for _ in range(2)]
    res = torch.randn(ROWS, WIDTH, device=dev, dtype=dtype, generator=gen)
    w = (1 + 0.1 * torch.randn(WIDTH, device=dev, generator=gen)).to(dtype)
    want_out, want_res = add_rms_norm((xs[0].float() + xs[1].float()).to(dtype), res, w, EPS)
    results = {"one_rank": one_rank_us(xs[0], res, w)}
    print(f"one_rank (add + norm alone): {results['one_rank'][0]:.2f} us", flush=True)
    for protocol in ("pull", "push", "ll"):
        calls, keep = ranks_for(protocol, dev)
        results[protocol] = pair_us(calls, [(xs[r], res, w) for r in range(2)])
        streams = [torch.cuda.Stream() for _ in range(2)]
        outs = [None, None]
        for r in range(2):
            with torch.cuda.stream(streams[r]):
                outs[r] = calls[r](xs[r], res, w)
        torch.cuda.synchronize()
        ok = all(torch.equal(o[1], want_res) and
                 torch.allclose(o[0].float(), want_out.float(), rtol=1e-2, atol=1e-2)
                 for o in outs) and torch.equal(outs[0][0], outs[1][0])
        results[protocol + "_matches"] = ok
        print(f"{protocol}: {results[protocol][0]:.2f} us a pair of calls (min "
              f"{results[protocol][1]:.2f}); matches the reference: {ok}", flush=True)
        del keep
    out = {"device": torch.cuda.get_device_name(), "git_commit": git_commit(),
           "date": now_iso(), "command": " ".join(["python3"] + sys.argv),
           "ceilings": dataclasses.asdict(ceil), "rows": ROWS, "width": WIDTH,
           "calls_per_graph": CALLS, "replays": REPLAYS, "results_us": results}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
