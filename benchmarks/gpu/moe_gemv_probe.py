"""The fused MoE's GEMV kernels at decode sizes: the launch-per-tile forms (what main runs)
against the persistent forms (`PERSISTENT` > 0 in the config), and a dense GEMV of the
same bytes as what the streaming structure itself reaches.

Each kernel is timed in a CUDA graph of R back-to-back launches, each with its own routing
(random distinct experts per token), so the experts' weights come from memory, as in the
model where other layers' weights evict them between two MoE calls, and launches follow
each other as the model's graph replays them: graph time / R, median of several replays.
The floor is the touched experts' bytes (gate_up 2 * H * I, down H * I per slot) at the
copy rate measured in the same run.

    python3 moe_gemv_probe.py OUT.json [--tp 1 2] [--rows 1 2] [--reps 24] [--write-table DIR]

--write-table DIR: where the best persistent pair beats main's by more than 3%, its config
goes into DIR's table for that shape at that M (the other entries kept), for an end-to-end
A/B through LOOM_MOE_CONFIG_DIR.
"""
import argparse
import itertools
import json
import os

import torch

from loom.bench.ceilings import measure_ceilings
from loom.bench.moe_space import moe_shape
from loom.kernels.compile_pool import compile_pool
from loom.kernels.fused_moe import moe_reference
from loom.kernels.gemv import GemvConfig, _launch as gemv_launch
from loom.kernels.moe_config import config_file_name, get_config
from loom.kernels.tuned import device_name
from loom.kernels.moe_gemv import moe_gemv_launches

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("out")
ap.add_argument("--model", default="qwen3-30b-a3b")
ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
ap.add_argument("--rows", type=int, nargs="+", default=[1, 2])
ap.add_argument("--reps", type=int, default=24)
ap.add_argument("--write-table", default=None)
args = ap.parse_args()

dev = torch.device("cuda")
ceil = measure_ceilings(dev)
print(f"ceilings: copy {ceil.copy_tb_per_s:.3f} TB/s", flush=True)
results = {"ceilings": {"copy_tb_per_s": ceil.copy_tb_per_s,
                        "matmul_tflop_per_s": ceil.matmul_tflop_per_s},
           "device": torch.cuda.get_device_name(), "rows": []}


def graph_us(fns, replays=7):
    """Median over replays of (a graph of every fn, back to back) / len(fns)."""
    for f in fns[:2]:
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g.capture_begin()
        for f in fns:
            f()
        g.capture_end()
    torch.cuda.current_stream().wait_stream(s)
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(fns))
    return sorted(times)[len(times) // 2]


def variants(wide: bool):
    grid = (((2, 4, 8, 16), (256, 512, 1024), (3, 4), (1, 2, 3, 4, 6)) if wide else
            ((4, 8, 16), (512, 1024), (3, 4), (1, 2, 4)))
    for bn, bk, st, per in itertools.product(*grid):
        yield "persistent", {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": 4,
                             "num_stages": st, "PERSISTENT": per}


for tp, m in itertools.product(args.tp, args.rows):
    shape = moe_shape(args.model, tp)
    H, I, E, K = shape.hidden, shape.inter, shape.num_experts, shape.top_k
    torch.manual_seed(0)
    w13 = torch.randn(E, 2 * I, H, device=dev, dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(E, H, I, device=dev, dtype=torch.bfloat16) * 0.02
    # Consecutive launches route to disjoint experts (groups of K from one permutation),
    # so none finds the previous launch's experts in L2.
    groups = torch.randperm(E, device=dev)[:E // K * K].view(-1, K)
    xs, ws, idss = [], [], []
    for r in range(args.reps):
        xs.append(torch.randn(m, H, device=dev, dtype=torch.bfloat16) * 0.1)
        idss.append(torch.stack([groups[(r * m + t) % len(groups)] for t in range(m)]))
        ws.append(torch.softmax(torch.randn(m, K, device=dev), -1))
    touched = [len(torch.unique(i)) for i in idss]
    n_exp = sum(touched) / len(touched)
    floor_gu = n_exp * 2 * H * I * 2 / (ceil.copy_tb_per_s * 1e12) * 1e6
    floor_dn = n_exp * H * I * 2 / (ceil.copy_tb_per_s * 1e12) * 1e6
    tuned = get_config(m, K, E, I, torch.bfloat16, dev, None)
    print(f"\n== tp{tp} M={m}: H={H} I={I} E={E} top{K}; floors gate_up {floor_gu:.1f} us, "
          f"down {floor_dn:.1f} us; tuned {tuned}", flush=True)
    main = dict(tuned) if tuned.get("GEMV") else {"BLOCK_N": 4, "BLOCK_K": 1024, "num_warps": 4,
                                                  "num_stages": 4, "GEMV": 1}
    cands = [("main(tuned)" if tuned.get("GEMV") else "main(a GEMV config)", main)]
    cands += list(variants(wide=(tp, m) == (args.tp[0], args.rows[0])))
    # Compile everything first on a pool of threads.
    with compile_pool(os.cpu_count() or 8, ignore_errors=True):
        for name, cfg in cands:
            try:
                launches, _ = moe_gemv_launches(xs[0], w13, w2, ws[0], idss[0], cfg)
                for kern, grid, a, kw in launches:
                    kern.warmup(*a, grid=grid, **kw)
            except Exception:
                pass
    ref = moe_reference(xs[0], w13, w2, ws[0], idss[0]).float()
    rows = []
    for name, cfg in cands:
        try:
            per_rep = [moe_gemv_launches(x, w13, w2, w, i, cfg) for x, w, i in zip(xs, ws, idss)]
            out0 = per_rep[0][1]
            for kern, grid, a, kw in per_rep[0][0]:
                kern[grid](*a, **kw)
            err = ((out0.float() - ref).abs().max() / ref.abs().max()).item()
            if not err < 2e-2:
                print(f"  WRONG {name} {cfg}: rel err {err:.3g}")
                continue
            gu = graph_us([lambda l=l: l[0][0][0][l[0][0][1]](*l[0][0][2], **l[0][0][3])
                           for l in per_rep])
            dn = graph_us([lambda l=l: l[0][1][0][l[0][1][1]](*l[0][1][2], **l[0][1][3])
                           for l in per_rep])
        except Exception as e:  # out of resources
            print(f"  skipped {name} {cfg}: {type(e).__name__}: {str(e)[:80]}")
            continue
        rows.append({"name": name, "config": cfg, "gate_up_us": gu, "down_us": dn})
    main = rows[0]
    best_gu = min(rows[1:], key=lambda r: r["gate_up_us"])
    best_dn = min(rows[1:], key=lambda r: r["down_us"])
    for label, r, key, fl in (("gate_up main", main, "gate_up_us", floor_gu),
                              ("gate_up best persistent", best_gu, "gate_up_us", floor_gu),
                              ("down main", main, "down_us", floor_dn),
                              ("down best persistent", best_dn, "down_us", floor_dn)):
        print(f"  {label:26s} {r[key]:6.1f} us ({fl / r[key]:5.1%} of the copy rate) {r['config']}")
    top = sorted(rows[1:], key=lambda r: r["gate_up_us"] + r["down_us"])[:5]
    print("  best pairs (one config for both):", [f"{r['gate_up_us'] + r['down_us']:.1f} "
                                                  f"{r['config']}" for r in top])
    # A dense GEMV of gate_up's bytes: N = 8 experts' 2I rows, K = H, R distinct weights.
    dense = []
    for _ in range(min(args.reps, 12)):
        dense.append((torch.randn(m, H, device=dev, dtype=torch.bfloat16),
                      torch.randn(int(n_exp) * 2 * I, H, device=dev, dtype=torch.bfloat16)))
    dense_rows = []
    for bn, bk in itertools.product((8, 16, 32), (256, 512)):
        cfg = GemvConfig(block_n=bn, block_k=bk, num_warps=4, num_stages=4)
        try:
            t = graph_us([lambda x=x, w=w: gemv_launch(x, w, cfg, False) for x, w in dense])
        except Exception as e:
            print(f"  dense skipped {cfg}: {type(e).__name__}")
            continue
        dense_rows.append((t, cfg.describe()))
    dense_rows.sort()
    if dense_rows:
        print(f"  dense GEMV, gate_up's bytes: {dense_rows[0][0]:.1f} us "
              f"({floor_gu / dense_rows[0][0]:.1%}) {dense_rows[0][1]}")
    pair = top[0]
    gain = (main["gate_up_us"] + main["down_us"]) / (pair["gate_up_us"] + pair["down_us"])
    if args.write_table and gain > 1.03:
        path = os.path.join(args.write_table, config_file_name(E, I, torch.bfloat16,
                                                               device_name(dev)))
        table = json.load(open(path)) if os.path.isfile(path) else {}
        table[str(m)] = {"BLOCK_M": 16, "GROUP_M": 1, "GEMV": 1, "TMA": 0, **pair["config"]}
        with open(path, "w") as f:
            json.dump(dict(sorted(table.items(), key=lambda kv: int(kv[0]))), f, indent=4)
        print(f"  wrote M={m} into {path} ({gain:.3f}x main)")
    results["rows"].append({"tp": tp, "m": m, "gain": gain, "floor_gate_up_us": floor_gu,
                            "floor_down_us": floor_dn, "tuned": tuned, "timed": rows,
                            "dense_gate_up": dense_rows[:3]})
    del w13, w2
    torch.cuda.empty_cache()
with open(args.out, "w") as f:
    json.dump(results, f, indent=1)
print("wrote", args.out)
