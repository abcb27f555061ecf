"""The GEMV that all-reduces its own input (LOOM_GEMV_ALL_REDUCE=1), on one GPU: what the
fusion costs a call beside the kernels it replaces, the exchange with the peer aside.

One TP=2 rank's qkv and gate_up (Llama-3.1-8B) at one row, with their gemv_norm configs:
  fused_norm:  `add_rms_norm_gemv` (the add + norm in the GEMV, no all-reduce);
  two_kernels: loom's add + norm kernel (the all-reduce + norm kernel's one-rank form),
               then `linear`: today's TP=2 chain without its exchange;
  all_reduce:  the all-reducing GEMV of rank 0, each call preceded by rank 1's push into
               rank 0's buffer, simulated by two torch ops (a copy and an add), whose own
               time (push_only, timed alone) is taken off.
Each variant is one CUDA graph of CALLS calls over ROTATE weights (so the weights stream
from memory, not L2), replayed REPLAYS times; microseconds a call, median and min.

    python3 benchmarks/gpu/ar_gemv_probe.py OUT.json

LOOM_PDL_PREFETCH_MB=N: each all-reducing call asks N MiB of its weight into L2 before it
waits for the exchange.
"""

import dataclasses
import json
import statistics
import sys

import torch

from loom.bench.ceilings import measure_ceilings
from loom.bench.common import git_commit, now_iso
from loom.kernels.all_reduce_gemv import GemvExchange
from loom.kernels.all_reduce_norm import add_rms_norm
from loom.kernels.gemv import MAX_M, add_rms_norm_gemv
from loom.kernels.gemv_decode import linear, norm_config

SHAPES = {"rank_qkv": (3072, 4096), "rank_gate_up": (14336, 4096)}
CALLS, REPLAYS, ROTATE, EPS = 32, 20, 4, 1e-5


def graph_us(call) -> tuple[float, float]:
    for i in range(2):  # compile and warm outside the capture
        call(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS):
            call(i)
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


def main() -> None:
    dev, dtype = torch.device("cuda"), torch.bfloat16
    ceil = measure_ceilings(dev)
    results = {}
    for name, (n, k) in SHAPES.items():
        cfg = norm_config(1, n, k, dtype, dev)
        if cfg is None:
            print(f"{name}: no gemv_norm config on this GPU; skipped", flush=True)
            continue
        ws = [torch.randn(n, k, device=dev, dtype=dtype) / k ** 0.5 for _ in range(ROTATE)]
        x, x_peer, res = (torch.randn(1, k, device=dev, dtype=dtype) for _ in range(3))
        nw = (1 + 0.1 * torch.randn(k, device=dev)).to(dtype)
        # Two ranks' exchanges over one device's buffers; only rank 0's calls run.
        elems = GemvExchange.data_elems(2, k, ROTATE)
        data = [torch.zeros(elems, device=dev, dtype=dtype) for _ in range(2)]
        flags = [torch.zeros(ROTATE, device=dev, dtype=torch.int32) for _ in range(2)]
        ex = GemvExchange(0, 2, torch.tensor([d.data_ptr() for d in data], device=dev),
                          torch.tensor([f.data_ptr() for f in flags], device=dev),
                          dtype, k, ROTATE)
        slot = MAX_M * k

        def push(i):  # rank 1's push for site i into rank 0's buffer, and its signal
            start = (i % ROTATE) * 2 * slot + slot
            data[0][start:start + k].copy_(x_peer.view(-1))
            flags[0][i % ROTATE:i % ROTATE + 1].add_(1)

        def all_reduce(i):
            push(i)
            add_rms_norm_gemv(x, res, nw, EPS, ws[i % ROTATE], config=cfg, exchange=ex,
                              site=i % ROTATE)

        def two_kernels(i):
            normed, _ = add_rms_norm(x, res, nw, EPS)
            linear(normed, ws[i % ROTATE])

        entry = {"config": cfg.describe(),
                 "floor_us": n * k * 2 / (ceil.copy_tb_per_s * 1e12) * 1e6}
        for label, call in (("fused_norm", lambda i: add_rms_norm_gemv(
                x, res, nw, EPS, ws[i % ROTATE], config=cfg)), ("two_kernels", two_kernels),
                ("push_only", push), ("all_reduce", all_reduce)):
            entry[label] = graph_us(call)
        push(0)
        y_ar, _ = add_rms_norm_gemv(x, res, nw, EPS, ws[0], config=cfg, exchange=ex, site=0)
        y_ref, _ = add_rms_norm_gemv((x.float() + x_peer.float()).to(dtype), res, nw, EPS,
                                     ws[0], config=cfg)
        entry["matches_reference"] = bool(torch.equal(y_ar, y_ref))
        entry["all_reduce_net_us"] = entry["all_reduce"][0] - entry["push_only"][0]
        entry["rank0_flags_left"] = flags[0].tolist()  # each push consumed: all 0
        results[name] = entry
        print(f"{name} ({cfg.describe()}): fused_norm {entry['fused_norm'][0]:.2f} us, "
              f"two_kernels {entry['two_kernels'][0]:.2f}, all_reduce "
              f"{entry['all_reduce_net_us']:.2f} net ({entry['all_reduce'][0]:.2f} with the "
              f"simulated push, push alone {entry['push_only'][0]:.2f}); floor "
              f"{entry['floor_us']:.2f}; matches {entry['matches_reference']}", flush=True)
    out = {"device": torch.cuda.get_device_name(), "git_commit": git_commit(),
           "date": now_iso(), "command": " ".join(["python3"] + sys.argv),
           "ceilings": dataclasses.asdict(ceil), "calls_per_graph": CALLS, "replays": REPLAYS,
           "results": results}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
