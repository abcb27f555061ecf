"""Residual add + RMSNorm read by the GEMV (`kernels/gemv.add_rms_norm_gemv`) against the
two kernels `loom.decode_add_rms_norm_linear` otherwise runs (loom's add + norm kernel,
then `linear`: the measured GEMV config, or cuBLAS), for Llama-3.1-8B's qkv and gate_up,
one TP=2 rank's, and Qwen3-30B-A3B's qkv (its MoE reads the other norm), at 1-4 rows. Each variant is one CUDA graph replayed after an L2
flush (loom.bench.kernel_timing), so the idle between the two kernels counts. The floor is
the weight's bytes over the copy rate measured here.

The fused call is timed with every row-reduction tile gemv_bench's first stage searches
(unsplit, 1 or 3 stages; all compiled first on a pool of threads), and the plain table's
config where that is one. --write-table PATH merges the winners into the "gemv_norm" table
that `kernels/gemv_decode.norm_config` reads: per shape, the rows at which the best fused
config beat the two kernels by 2%; a shape's other rows keep the two kernels.

    python3 benchmarks/gpu/norm_gemv_probe.py OUT.json [--write-table PATH] [--ms 1,2]
        [--shapes 8b_qkv,8b_gate_up,rank_qkv,rank_gate_up,q3_qkv]
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemv_search import fits, fma_tiles  # noqa: E402

from loom.bench.ceilings import measure_ceilings  # noqa: E402
from loom.bench.common import git_commit, now_iso  # noqa: E402
from loom.bench.kernel_timing import KernelTimer  # noqa: E402
from loom.kernels.all_reduce_norm import add_rms_norm  # noqa: E402
from loom.kernels.compile_pool import compile_pool  # noqa: E402
from loom.kernels.gemv import GemvConfig, add_rms_norm_gemv  # noqa: E402
from loom.kernels.gemv_decode import linear, tuned_config  # noqa: E402

SHAPES = {"8b_qkv": (6144, 4096), "8b_gate_up": (28672, 4096), "rank_qkv": (3072, 4096),
          "rank_gate_up": (14336, 4096), "q3_qkv": (5120, 2048)}  # name: (N, K)
EPS, MARGIN = 1e-5, 0.98

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("output_json")
ap.add_argument("--write-table", metavar="PATH", default=None)
ap.add_argument("--ms", default="1", help="row counts, comma-separated (1..4)")
ap.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset")
args = ap.parse_args()
try:
    ms = [int(v) for v in args.ms.split(",")]
except ValueError:
    ap.error(f"--ms: comma-separated row counts, got {args.ms!r}")
if not all(1 <= m <= 4 for m in ms):
    ap.error(f"--ms: row counts of 1 to 4, got {ms}")
names = args.shapes.split(",")
if unknown := [v for v in names if v not in SHAPES]:
    ap.error(f"unknown shapes {unknown}; known: {list(SHAPES)}")
ks = sorted({SHAPES[v][1] for v in names})

dev, dtype = torch.device("cuda"), torch.bfloat16
ceil = measure_ceilings(dev)
timer = KernelTimer(dev, 3, 30)
nws = {k: (1 + 0.1 * torch.randn(k, device=dev)).to(dtype) for k in ks}


def candidates(m, k):
    cands = [GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=s)
             for bn, bk, w in fma_tiles(m) for s in (1, 3)]
    return [c for c in cands if fits(c, k)]


xs = {(m, k): (torch.randn(m, k, device=dev, dtype=dtype),
               torch.randn(m, k, device=dev, dtype=dtype)) for m in ms for k in ks}
with compile_pool(max_threads=14):  # every candidate's kernel, ahead of the timing
    for k in ks:
        w0 = torch.empty(64, k, device=dev, dtype=dtype)
        for m in ms:
            for cfg in candidates(m, k):
                add_rms_norm_gemv(*xs[m, k], nws[k], EPS, w0, config=cfg, compile_only=True)
timer.spin()

rows, table = [], {}
for name in names:
    n, k = SHAPES[name]
    nw = nws[k]
    w = torch.randn(n, k, device=dev, dtype=dtype) / k ** 0.5
    floor_us = n * k * 2 / (ceil.copy_tb_per_s * 1e12) * 1e6
    for m in ms:
        x, r = xs[m, k]
        plain = tuned_config(m, n, k, dtype, dev)

        def separate():
            normed, res = add_rms_norm(x, r, nw, EPS)
            return linear(normed, w), res

        y0, r0 = separate()
        t_sep = timer.time_us(separate)
        cands = candidates(m, k)
        if plain is not None and plain.split_k == 1 and not plain.use_dot:
            cands = [plain] + [c for c in cands if c != plain]
        timed = []
        for cfg in cands:
            y1, r1 = add_rms_norm_gemv(x, r, nw, EPS, w, config=cfg)
            diff = float((y0.float() - y1.float()).abs().max() / y0.float().abs().max())
            if diff > 2e-2 or not torch.equal(r0, r1):
                print(f"{name} M={m} {cfg.describe()}: wrong (rel diff {diff:.2g})")
                continue
            timed.append((timer.time_us(lambda: add_rms_norm_gemv(x, r, nw, EPS, w,
                                                                  config=cfg)), cfg, diff))
        if not timed:
            print(f"{name} M={m}: no candidate matched the two kernels; left unfused")
            table.setdefault(f"{n},{k}", {})
            continue
        timed.sort(key=lambda t: t[0])
        best_us, best, diff = timed[0]
        wins = best_us < t_sep * MARGIN
        per_m = table.setdefault(f"{n},{k}", {})
        if wins:
            per_m[str(m)] = {f: getattr(best, f) for f in
                             ("block_n", "block_k", "num_warps", "num_stages")}
        rows.append(dict(shape=name, n=n, k=k, m=m, floor_us=floor_us, separate_us=t_sep,
                         separate_gemv=plain.describe() if plain else "cuBLAS",
                         fused_us=best_us, fused_config=best.describe(), rel_diff=diff,
                         fused_wins=wins, candidates=[(t, c.describe()) for t, c, _ in timed]))
        print(f"{name:13s} M={m}: floor {floor_us:6.1f} us; add+norm then "
              f"{plain.describe() if plain else 'cuBLAS'} {t_sep:6.1f}; fused "
              f"{best.describe()} {best_us:6.1f} ({t_sep - best_us:+.1f} us; floor/fused "
              f"{floor_us / best_us:.2f}); next {[f'{t:.1f}' for t, _, _ in timed[1:4]]}")

if args.write_table:
    merged = json.load(open(args.write_table)) if os.path.exists(args.write_table) else {}
    for shape, per_m in table.items():
        entry = merged.setdefault(shape, {})
        for m in ms:
            entry.pop(str(m), None)
        entry.update(per_m)
    with open(args.write_table, "w") as f:
        json.dump(merged, f, indent=1)
    print(f"wrote {args.write_table}")
json.dump({"benchmark": "norm-gemv-probe", "date": now_iso(), "git_commit": git_commit(),
           "device": torch.cuda.get_device_name(dev), "command": " ".join(sys.argv),
           "ceilings": vars(ceil), "timing": timer.method, "rows": rows},
          open(args.output_json, "w"), indent=1)
