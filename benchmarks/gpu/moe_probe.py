"""Each fused-MoE kernel alone, against the copy rate: where does a decode-size MoE call
lose its time, and would a config per kernel do better than the tuned one they share?

For each token count M: the experts' weight bytes the routing touches (gate_up reads
2 * H * I of each, down H * I), then gate_up and down timed alone (CUDA graph, L2 flushed:
KernelTimer) for every config `loom bench moe --tune` would search at M, plus the tuned
table's and the tuned tiles with TMA switched. Prints, per kernel, the tuned config's time
and the best grouped-GEMM (pointer loads, and TMA) and GEMV (loom/kernels/moe_gemv.py)
configs', as a share of the copy rate over those bytes (the compute-bound sizes:
as TFLOP/s too), and the whole call with the tuned config.

    python3 moe_probe.py [--model qwen3-30b-a3b] [--rows 1 128 512 1024 16384] [--json OUT]
"""
import argparse
import itertools
import json

import torch

from loom.bench.ceilings import measure_ceilings
from loom.bench.moe import Bench, _precompile
from loom.bench.moe_space import moe_shape, search_space, tile_config
from loom.kernels import fused_moe as fm
from loom.kernels import moe_config as mc

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", default="qwen3-30b-a3b")
parser.add_argument("--rows", type=int, nargs="+", default=[1, 128, 512, 1024, 16384])
parser.add_argument("--search-up-to", type=int, default=2048,
                    help="past this M only the tuned config is timed")
parser.add_argument("--gemv-grid", action="store_true",
                    help="at M <= 8 also a wider GEMV grid than the tuner's (BLOCK_K 128-2048, "
                         "BLOCK_N 2-32, 2-8 warps, 2-5 stages): would a config per kernel pay?")
parser.add_argument("--grouped-mm-from", type=int, default=1024,
                    help="from this M on, also time torch._grouped_mm (CUTLASS's grouped GEMM) "
                         "at both kernels' shapes, its rows gathered into expert order: a peer "
                         "for the grouped GEMM at prompt sizes")
parser.add_argument("--json", default=None)
args = parser.parse_args()

shape = moe_shape(args.model, 1)
bench = Bench(shape, torch.bfloat16, seed=0, warmup=3, iters=20)
ceil = measure_ceilings(bench.device)
print(f"ceilings: copy {ceil.copy_tb_per_s:.3f} TB/s, matmul {ceil.matmul_tflop_per_s:.1f} "
      f"TFLOP/s", flush=True)
KERNELS = ("gate_up", "down")
results = {"ceilings": {"copy_tb_per_s": ceil.copy_tb_per_s,
                        "matmul_tflop_per_s": ceil.matmul_tflop_per_s}, "rows": []}


def time_kernels(config):
    cfg = mc.get_config(bench.num_tokens, shape.top_k, shape.num_experts, shape.inter,
                        torch.bfloat16, bench.device, config)
    launches, _ = fm.kernel_launches(*bench.inputs, cfg)
    return [bench.timer.time_us(lambda k=k, g=g, a=a, kw=kw: k[g](*a, **kw))
            for k, g, a, kw in launches]


def time_grouped_mm(flops):
    """torch._grouped_mm at gate_up's and down's shapes (no SiLU, no routing weight), and
    the gather that puts a step's rows in expert order, which it needs and we do not."""
    x, w13, w2, _, ids = bench.inputs
    order = torch.argsort(ids.flatten(), stable=True)
    offs = torch.bincount(ids.flatten(), minlength=shape.num_experts).cumsum(0).to(torch.int32)
    token = (order // shape.top_k).contiguous()
    xs = x.index_select(0, token)
    act = torch.randn(xs.shape[0], shape.inter, device=x.device, dtype=x.dtype) * 0.1
    w13t, w2t = w13.transpose(1, 2), w2.transpose(1, 2)
    out = {"gather_us": bench.timer.time_us(lambda: x.index_select(0, token)),
           "gate_up_us": bench.timer.time_us(lambda: torch._grouped_mm(xs, w13t, offs=offs)),
           "down_us": bench.timer.time_us(lambda: torch._grouped_mm(act, w2t, offs=offs))}
    for name in KERNELS:
        print(f"  {name:7s} torch._grouped_mm {out[name + '_us']:8.1f} us, "
              f"{flops[name] / out[name + '_us'] / 1e6:6.1f} TFLOP/s", flush=True)
    print(f"  gather into expert order {out['gather_us']:.1f} us", flush=True)
    return out


for m in args.rows:
    bench.set_batch(m)
    expert_bytes = 2 * shape.hidden * shape.inter  # one H x I matrix in bf16
    nbytes = {"gate_up": 2 * expert_bytes * bench.experts_touched,
              "down": expert_bytes * bench.experts_touched}
    flops = {"gate_up": 4 * m * shape.top_k * shape.hidden * shape.inter,
             "down": 2 * m * shape.top_k * shape.hidden * shape.inter}
    tuned = mc.get_config(m, shape.top_k, shape.num_experts, shape.inter, torch.bfloat16,
                          bench.device)
    configs = [tuned] + (search_space(shape, m) if m <= args.search_up_to else [])
    if not tuned.get("GEMV"):  # the tuned tiles the other way round: TMA on, or off
        configs.insert(1, {**tuned, "TMA": 1 - tuned.get("TMA", 0)})
    if args.gemv_grid and m <= 8:
        grid = itertools.product((2, 4, 8, 16, 32), (128, 256, 512, 1024, 2048), (2, 4, 8),
                                 (2, 3, 4, 5))
        configs += [tile_config(16, bn, bk, 1, w, st, gemv=1) for bn, bk, w, st in grid
                    if bn * bk <= 16384 and tile_config(16, bn, bk, 1, w, st, gemv=1)
                    not in configs]
    _precompile(bench, configs)
    timed = []
    for config in configs:
        try:
            timed.append((config, time_kernels(config)))
        except Exception as e:  # a config the compiler refuses: skip it, say so
            print(f"  skipped {config}: {type(e).__name__}: {str(e)[:100]}")
    row = {"M": m, "experts_touched": bench.experts_touched,
           "call_us": bench.time_us(tuned), "kernels": {}}
    print(f"M={m} ({bench.experts_touched} experts): the whole call {row['call_us']:.1f} us "
          f"with the tuned config", flush=True)
    for i, name in enumerate(KERNELS):
        floor_us = nbytes[name] / (ceil.copy_tb_per_s * 1e6)
        picks = {"tuned": timed[0]}
        for label, gemv, tma in (("best grouped", 0, 0), ("best TMA", 0, 1),
                                 ("best GEMV", 1, 0)):
            cands = [t for t in timed[1:] if t[0].get("GEMV", 0) == gemv
                     and t[0].get("TMA", 0) == tma]
            if cands:
                picks[label] = min(cands, key=lambda t: t[1][i])
        row["kernels"][name] = {"floor_us": floor_us}
        for label, (config, us) in picks.items():
            row["kernels"][name][label] = {"config": config, "us": us[i]}
            print(f"  {name:7s} {label:12s} {us[i]:8.1f} us: {floor_us / us[i]:6.1%} of the "
                  f"copy rate, {flops[name] / us[i] / 1e6:6.1f} TFLOP/s  {config}", flush=True)
    if m >= args.grouped_mm_from and hasattr(torch, "_grouped_mm"):
        try:
            row["grouped_mm"] = time_grouped_mm(flops)
        except Exception as e:  # not built for this GPU or this torch: say so, go on
            print(f"  torch._grouped_mm: {type(e).__name__}: {str(e)[:160]}", flush=True)
    results["rows"].append(row)
if args.json:
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
