"""TP=2 decode's all-reduce + add + norm moved into the GEMVs on either side of it, both
ranks on one GPU at once (two streams), Llama-3.1-8B's rank shapes at one row:

  kernel:  o_proj GEMV -> LL all-reduce + add + norm kernel -> gate_up GEMV, and
           down GEMV (SiLU*mul inside) -> the same kernel -> the next qkv GEMV (what
           LOOM_AR_NORM_LL=1 runs now);
  fused:   o_proj `gemv_ll_push` -> gate_up `add_rms_norm_gemv(ll=)`, and the same for
           down -> qkv: no all-reduce launch at all;
  apart:   the fused chain's kernels with no exchange (plain GEMV, then the add + norm
           GEMV over this rank's own partial), the two ranks' chains independent.

Each variant is one CUDA graph of LAYERS layers (distinct weights) per rank, rank 0 on one
stream and rank 1 on another, each rank's consumer made to wait for the other rank's
producer (see `lockstep`; in every variant alike), replayed REPLAYS times; microseconds a
layer (a pair of layers at once), median and min, each variant twice, alternated. On one
GPU the two ranks share its bandwidth and the peer's memory is local: fused - apart is what
the exchange costs beside the kernels, not NVLink's latency, which `kernel` and `fused`
both pay once per exchange on a real pair. Checked: the ranks' residuals equal bit for
bit, and fused's last layer against kernel's.

    python3 benchmarks/gpu/ll_gemv_probe.py OUT.json
"""

import dataclasses
import json
import os
import statistics
import sys

import torch

from loom.bench.ceilings import measure_ceilings
from loom.bench.common import git_commit, now_iso
from loom.kernels.all_reduce_norm_ll import LowLatencyNormBuffer
from loom.kernels import gemv as gemv_mod
from loom.kernels.gemv import GemvConfig, add_rms_norm_gemv, gemv, gemv_ll_push
from loom.kernels.gemv_decode import norm_config, tuned_config

HID, QKV, INTER, HEADS_OUT = 4096, 3072, 7168, 2048  # one TP=2 rank of Llama-3.1-8B
LAYERS, REPLAYS, EPS, MAX_ROWS = 16, 20, 1e-5, 64
PRODUCED = "produced"


def config(n, k, dev, norm=False):
    cfg = (norm_config if norm else tuned_config)(1, n, k, torch.bfloat16, dev)
    return cfg or GemvConfig(block_n=8, block_k=1024)


def main() -> None:
    gemv_mod._LL_DEBUG[0] = int(os.environ.get("LL_DEBUG", "0"))  # experiments only
    dev, dt = torch.device("cuda"), torch.bfloat16
    ceil = measure_ceilings(dev)
    gen = torch.Generator(dev).manual_seed(0)

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, device=dev, generator=gen) * scale).to(dt)
    layers = [[dict(o=rnd(HID, HEADS_OUT, scale=HEADS_OUT ** -0.5),
                    qkv=rnd(QKV, HID, scale=HID ** -0.5),
                    down=rnd(HID, INTER, scale=INTER ** -0.5),
                    gu=rnd(2 * INTER, HID, scale=HID ** -0.5),
                    n1=(1 + 0.1 * rnd(HID)), n2=(1 + 0.1 * rnd(HID)))
               for _ in range(LAYERS)] for _ in range(2)]
    cfg = dict(o=config(HID, HEADS_OUT, dev), down=config(HID, INTER, dev),
               qkv=config(QKV, HID, dev), gu=config(2 * INTER, HID, dev),
               qkv_norm=config(QKV, HID, dev, True), gu_norm=config(2 * INTER, HID, dev, True))
    print({k: v.describe() for k, v in cfg.items()}, flush=True)
    words = LowLatencyNormBuffer.words(2, MAX_ROWS, HID)
    bufs = [torch.zeros(words, dtype=torch.int64, device=dev) for _ in range(2)]
    ptrs = torch.tensor([b.data_ptr() for b in bufs], device=dev)
    ll = [LowLatencyNormBuffer(r, 2, ptrs, MAX_ROWS, HID) for r in range(2)]
    attn = [rnd(1, HEADS_OUT) for _ in range(2)]  # each rank's attention output
    residual0 = rnd(1, HID)

    def chain(rank, variant):
        """One rank's LAYERS layers, each o_proj -> (exchange) -> gate_up -> down ->
        (exchange) -> the next layer's qkv, yielding after every launch (PRODUCED after a
        producer's); returns the last
        (qkv, gate_up, residual)."""
        res = residual0
        mine = ll[rank] if variant == "fused" else None
        for w in layers[rank]:
            if variant == "kernel":
                part = gemv(attn[rank], w["o"], config=cfg["o"])
                yield PRODUCED
                h, res = ll[rank].launch(part, res, w["n1"], EPS)
                yield
                gu = gemv(h, w["gu"], config=cfg["gu"])
                yield
                part = gemv(gu, w["down"], silu_mul_input=True, config=cfg["down"])
                yield PRODUCED
                h, res = ll[rank].launch(part, res, w["n2"], EPS)
                yield
                qkv = gemv(h, w["qkv"], config=cfg["qkv"])
                yield
                continue
            if mine is not None:
                part = gemv_ll_push(attn[rank], w["o"], mine, config=cfg["o"])
            else:
                part = gemv(attn[rank], w["o"], config=cfg["o"])
            yield PRODUCED
            gu, res = add_rms_norm_gemv(part, res, w["n1"], EPS, w["gu"],
                                        config=cfg["gu_norm"], ll=mine)
            yield
            if mine is not None:
                part = gemv_ll_push(gu, w["down"], mine, silu_mul_input=True,
                                    config=cfg["down"])
            else:
                part = gemv(gu, w["down"], silu_mul_input=True, config=cfg["down"])
            yield PRODUCED
            qkv, res = add_rms_norm_gemv(part, res, w["n2"], EPS, w["qkv"],
                                         config=cfg["qkv_norm"], ll=mine)
            yield
        return qkv, gu, res

    def lockstep(variant, streams):
        """Both ranks' chains launch by launch, rank 0 then rank 1. After each producer
        both streams wait for the other rank's producer: on one GPU a consumer launched
        before its peer's producer could fill the SMs with programs spinning on words that
        producer, left without an SM, never writes (on a real pair each rank has its
        GPU). Returns each rank's result."""
        gens = [chain(rank, variant) for rank in range(2)]
        results = [None, None]
        while results[0] is None:
            labels = []
            for rank in range(2):
                with torch.cuda.stream(streams[rank]):
                    try:
                        labels.append(next(gens[rank]))
                    except StopIteration as stop:
                        results[rank] = stop.value
            if labels and labels[0] == PRODUCED:
                events = [torch.cuda.Event() for _ in range(2)]
                for rank in range(2):
                    events[rank].record(streams[rank])
                for rank in range(2):
                    streams[rank].wait_event(events[1 - rank])
        return results

    def pair(variant):
        streams = [torch.cuda.Stream() for _ in range(2)]
        lockstep(variant, streams)  # warm-up: every kernel's module loaded
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        main_stream = torch.cuda.Stream()
        with torch.cuda.graph(graph, stream=main_stream):
            streams[0].wait_stream(main_stream)
            streams[1].wait_stream(main_stream)
            out0, out1 = lockstep(variant, streams)
            main_stream.wait_stream(streams[0])
            main_stream.wait_stream(streams[1])
        graph.replay()
        torch.cuda.synchronize()
        times = []
        for _ in range(REPLAYS):
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / LAYERS)
        return (statistics.median(times), min(times)), (out0, out1)

    results = {}
    outs = {}
    for variant in ("apart", "kernel", "fused", "apart", "kernel", "fused"):
        t, outs[variant] = pair(variant)
        results.setdefault(variant, []).append(t)
        print(f"{variant:7s} {t[0]:8.2f} us a layer (min {t[1]:.2f})", flush=True)
    # Checks: fused and kernel agree with each other and the ranks agree on the residual.
    checks = {}
    for variant in ("kernel", "fused"):
        (q0, g0, r0), (q1, g1, r1) = outs[variant]
        checks[variant + "_ranks_same_residual"] = bool(torch.equal(r0, r1))
    for i, name in enumerate(("qkv", "gate_up", "residual")):
        a, b = outs["kernel"][0][i].float(), outs["fused"][0][i].float()
        checks[f"{name}_fused_vs_kernel_rel"] = ((a - b).norm() / b.norm()).item()
    print(checks, flush=True)
    out = {"device": torch.cuda.get_device_name(), "git_commit": git_commit(),
           "date": now_iso(), "command": " ".join(["python3"] + sys.argv),
           "ceilings": dataclasses.asdict(ceil), "layers": LAYERS, "replays": REPLAYS,
           "configs": {k: v.describe() for k, v in cfg.items()},
           "us_per_layer_median_min": results, "checks": checks,
           "weight_bytes_per_layer_per_rank": 2 * (HID * HEADS_OUT + QKV * HID + HID * INTER
                                                   + 2 * INTER * HID)}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
