"""Residual add + RMSNorm read by the GEMV (`kernels/gemv.add_rms_norm_gemv`) against the
two kernels `loom.decode_add_rms_norm_linear` otherwise runs (loom's add + norm kernel,
then `linear`: the measured GEMV config, or cuBLAS), for Llama-3.1-8B's qkv and gate_up
and one TP=2 rank's, at 1-4 rows. Each variant is one CUDA graph replayed after an L2
flush (loom.bench.kernel_timing), so the idle between the two kernels counts. The floor is
the weight's bytes over the copy rate measured here.

The fused call is timed with every row-reduction tile gemv_bench's first stage searches
(unsplit, 1 or 3 stages; all compiled first on a pool of threads), and the plain table's
config where that is one. --write-table PATH merges the winners into the "gemv_norm" table
that `kernels/gemv_decode.norm_config` reads: per shape, the rows at which the best fused
config beat the two kernels by 2%; a shape's other rows keep the two kernels.

    python3 benchmarks/gpu/norm_gemv_probe.py OUT.json [--write-table PATH] [--ms 1,2]
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

SHAPES = (("8b qkv", 6144), ("8b gate_up", 28672), ("rank qkv", 3072),
          ("rank gate_up", 14336))
K, EPS, MARGIN = 4096, 1e-5, 0.98

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("output_json")
ap.add_argument("--write-table", metavar="PATH", default=None)
ap.add_argument("--ms", default="1", help="row counts, comma-separated (1..4)")
args = ap.parse_args()
ms = [int(v) for v in args.ms.split(",")]

dev, dtype = torch.device("cuda"), torch.bfloat16
ceil = measure_ceilings(dev)
timer = KernelTimer(dev, 3, 30)
nw = (1 + 0.1 * torch.randn(K, device=dev)).to(dtype)


def candidates(m):
    cands = [GemvConfig(block_n=bn, block_k=bk, num_warps=w, num_stages=s)
             for bn, bk, w in fma_tiles(m) for s in (1, 3)]
    return [c for c in cands if fits(c, K)]


xs = {m: (torch.randn(m, K, device=dev, dtype=dtype), torch.randn(m, K, device=dev,
                                                                    dtype=dtype)) for m in ms}
with compile_pool(max_threads=14):  # every candidate's kernel, ahead of the timing
    w0 = torch.empty(64, K, device=dev, dtype=dtype)
    for m in ms:
        for cfg in candidates(m):
            add_rms_norm_gemv(*xs[m], nw, EPS, w0, config=cfg, compile_only=True)
timer.spin()

rows, table = [], {}
for name, n in SHAPES:
    w = torch.randn(n, K, device=dev, dtype=dtype) / K ** 0.5
    floor_us = n * K * 2 / (ceil.copy_tb_per_s * 1e12) * 1e6
    for m in ms:
        x, r = xs[m]
        plain = tuned_config(m, n, K, dtype, dev)

        def separate():
            normed, res = add_rms_norm(x, r, nw, EPS)
            return linear(normed, w), res

        y0, r0 = separate()
        t_sep = timer.time_us(separate)
        cands = candidates(m)
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
        timed.sort(key=lambda t: t[0])
        best_us, best, diff = timed[0]
        wins = best_us < t_sep * MARGIN
        per_m = table.setdefault(f"{n},{K}", {})
        if wins:
            per_m[str(m)] = {f: getattr(best, f) for f in
                             ("block_n", "block_k", "num_warps", "num_stages")}
        rows.append(dict(shape=name, n=n, k=K, m=m, floor_us=floor_us, separate_us=t_sep,
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
