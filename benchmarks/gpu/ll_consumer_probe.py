"""Where the LL consumer GEMV's time goes (`add_rms_norm_gemv(..., ll=)`), one GPU, one
stream: a "peer" producer (`gemv_ll_push` of the other rank, sharing this rank's epoch
state so that its words carry the epoch the consumer waits for) then the consumer, LAYERS
times in one CUDA graph, against the same with the plain add + norm GEMV as consumer.
LL_DEBUG bits (kernels/gemv.py, experiments only): 1 no end-of-call atomic, 2 only
program 0 writes the summed row, 4 no poll (own partial only), 8 the peer's words read and
summed inside the weight loop (no prologue, no copy of the row).

    python3 benchmarks/gpu/ll_consumer_probe.py OUT.json
"""
import dataclasses
import json
import statistics
import sys

import torch

from loom.bench.ceilings import measure_ceilings
from loom.bench.common import git_commit, now_iso
from loom.kernels import gemv as gemv_mod
from loom.kernels.all_reduce_norm_ll import LowLatencyNormBuffer
from loom.kernels.gemv import add_rms_norm_gemv, gemv_ll_push
from loom.kernels.gemv_decode import norm_config, tuned_config

HID, LAYERS, REPLAYS = 4096, 8, 20
dev, dt = torch.device("cuda"), torch.bfloat16
ceil = measure_ceilings(dev)
gen = torch.Generator(dev).manual_seed(0)


def rnd(*shape, scale=1.0):
    return (torch.randn(*shape, device=dev, generator=gen) * scale).to(dt)


words = LowLatencyNormBuffer.words(2, 64, HID)
bufs = [torch.zeros(words, dtype=torch.int64, device=dev) for _ in range(2)]
ptrs = torch.tensor([b.data_ptr() for b in bufs], device=dev)
ll = [LowLatencyNormBuffer(r, 2, ptrs, 64, HID) for r in range(2)]
ll[1].state = ll[0].state  # one epoch for both: the "peer" runs on this stream
o_w = [rnd(HID, 2048, scale=2048 ** -0.5) for _ in range(LAYERS)]
o_cfg = tuned_config(1, HID, 2048, dt, dev)
attn = rnd(1, 2048)
residual = rnd(1, HID)
norm_w = 1 + 0.1 * rnd(HID)
rows = []
for name, n in (("qkv", 3072), ("gate_up", 14336)):
    cw = [rnd(n, HID, scale=HID ** -0.5) for _ in range(LAYERS)]
    cfg = norm_config(1, n, HID, dt, dev)
    own = rnd(1, HID)

    def layer(i, debug):
        gemv_ll_push(attn, o_w[i], ll[1], config=o_cfg)
        if debug is None:
            return add_rms_norm_gemv(own, residual, norm_w, 1e-5, cw[i], config=cfg)
        gemv_mod._LL_DEBUG[0] = debug
        try:
            return add_rms_norm_gemv(own, residual, norm_w, 1e-5, cw[i], config=cfg, ll=ll[0])
        finally:
            gemv_mod._LL_DEBUG[0] = 0

    for debug in (None, 0, 8, 9, None, 8):
        for i in range(LAYERS):
            layer(i, debug)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(LAYERS):
                layer(i, debug)
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
        label = "plain" if debug is None else f"ll debug {debug}"
        print(f"{name:8s} {label:12s} {statistics.median(times):8.2f} us a layer "
              f"(peer push + consumer; min {min(times):.2f})", flush=True)
        rows.append({"consumer": name, "variant": label, "us_median": statistics.median(times),
                     "us_min": min(times), "config": cfg.describe()})
json.dump({"device": torch.cuda.get_device_name(), "git_commit": git_commit(), "date": now_iso(),
           "command": " ".join(["python3"] + sys.argv), "ceilings": dataclasses.asdict(ceil),
           "rows": rows}, open(sys.argv[1], "w"), indent=1)
