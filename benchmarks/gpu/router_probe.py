#!/usr/bin/env python3
"""The MoE router's GEMV with its routing in one launch (loom.kernels.moe_route.router_topk)
against the two launches it replaces: the decode linear (gemv_decode.linear: the GEMV table's
tile, or cuBLAS) and then route_topk. Which tiles make the one launch pay?

At Qwen3-30B-A3B's router (128 experts over 2048, bf16) the GEMV reads 512 KB, a tenth of a
microsecond at the copy rate: both ways are latency, so the yardstick is the pair, not a
bandwidth floor. For each token count M, every tile of a grid (rows per program, K chunk,
warps, stages) is timed alone (loom.bench.kernel_timing.KernelTimer: a CUDA graph, L2
flushed before each replay, as the model's other layers leave it) beside the pair, each
checked first against the pair's routing on fresh inputs (the same experts; weights within
bf16's rounding of the logits). --write-table merges, per M, the fastest tile that beat the
pair by more than 2% into the router table router_topk reads (and drops an M where none
did: router_topk then takes the pair).

    python3 benchmarks/gpu/router_probe.py --json OUT [--write-table PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402

from loom.bench.ceilings import measure_ceilings  # noqa: E402
from loom.bench.kernel_timing import KernelTimer  # noqa: E402
from loom.kernels import gemv_decode  # noqa: E402
from loom.kernels.gemv import GemvConfig  # noqa: E402
from loom.kernels.moe_route import route_topk, router_topk  # noqa: E402

GRID = {"block_n": (1, 2, 4, 8), "block_k": (1024, 2048), "num_warps": (1, 2, 4),
        "num_stages": (1, 2)}


def agrees(got, want, logits: torch.Tensor) -> bool:
    """The same experts, or where not, experts whose probabilities (from the pair's logits)
    tie with the ones the pair chose within bf16's rounding."""
    (w, ids), (want_w, want_ids) = got, want
    if torch.equal(ids, want_ids):
        return bool(torch.allclose(w, want_w, atol=1e-3, rtol=1e-2))
    probs = torch.softmax(logits.float(), dim=-1)
    return bool(torch.allclose(probs.gather(1, ids), probs.gather(1, want_ids), rtol=2e-2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--json", required=True)
    parser.add_argument("--write-table", default=None)
    parser.add_argument("--margin", type=float, default=0.98)
    args = parser.parse_args()

    device = torch.device("cuda")
    torch.manual_seed(0)
    ceil = measure_ceilings(device)
    timer = KernelTimer(device, warmup=2, iters=50)
    timer.spin(0.5)
    e, k, top_k = args.experts, args.hidden, args.top_k
    weight = (torch.randn(e, k, device=device) / k ** 0.5 * 3).to(torch.bfloat16)
    out = {"device": torch.cuda.get_device_name(device), "shape": [e, k], "top_k": top_k,
           "ceilings": {"copy_tb_per_s": ceil.copy_tb_per_s,
                        "matmul_tflop_per_s": ceil.matmul_tflop_per_s},
           "weight_floor_us": e * k * 2 / (ceil.copy_tb_per_s * 1e6), "rows": {}}
    names = list(GRID)
    for m in args.rows:
        x = torch.randn(m, k, device=device).to(torch.bfloat16)
        pair_us = timer.time_us(lambda: route_topk(gemv_decode.linear(x, weight), top_k, True))
        rows = []
        for values in itertools.product(*GRID.values()):
            cfg = GemvConfig(**dict(zip(names, values)))
            fresh = torch.randn(m, k, device=device).to(torch.bfloat16)
            logits = gemv_decode.linear(fresh, weight)
            if not agrees(router_topk(fresh, weight, top_k, True, config=cfg),
                          route_topk(logits, top_k, True), logits):
                rows.append({"config": dict(zip(names, values)), "us": None, "error": True})
                continue
            us = timer.time_us(lambda cfg=cfg: router_topk(x, weight, top_k, True, config=cfg))
            rows.append({"config": dict(zip(names, values)), "us": us})
        timed = [r for r in rows if r["us"] is not None]
        best = min(timed, key=lambda r: r["us"])
        out["rows"][str(m)] = {"pair_us": pair_us, "best": best, "candidates": rows,
                               "failed_checks": sum(1 for r in rows if r.get("error"))}
        print(f"M={m}: pair {pair_us:.2f} us, one launch best {best['us']:.2f} us "
              f"({best['us'] / pair_us:.2f}x) with {best['config']}; "
              f"{out['rows'][str(m)]['failed_checks']} failed checks", flush=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
    if args.write_table:
        table = json.load(open(args.write_table)) if os.path.exists(args.write_table) else {}
        per_m = table.setdefault(f"{e},{k}", {})
        for m, r in out["rows"].items():
            if r["best"]["us"] < r["pair_us"] * args.margin:
                per_m[m] = r["best"]["config"]
            else:
                per_m.pop(m, None)
        if not per_m:
            table.pop(f"{e},{k}")
        with open(args.write_table, "w") as f:
            json.dump(table, f, indent=1)
        print(f"wrote {args.write_table}: {json.dumps(table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
