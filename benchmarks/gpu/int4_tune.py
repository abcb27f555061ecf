"""A search over loom's W4A16 kernels on one GPU: the tensor-core tile
(loom/kernels/int4_linear.py: how q - zero becomes bf16, `convert` 0/1/2, whole or by
slabs, and the tiles, at decode rows and a few prompt row counts against the op's
dequantize + dense GEMM and bf16's matmul) and the CUDA-core GEMV (int4_gemv.py). Every
config is checked against the float32 product of the dequantized weight before it is
timed (CUDA graph replays, L2 flushed: KernelTimer).

  python3 benchmarks/gpu/int4_tune.py --model llama-3.1-8b --budget-s 300 --out x.json
      [--stages gemv]

`--stages all` (the tiled kernel), each compiled ahead on a thread pool: 1. the unpacking
and the three conversions at a few decode tiles; 2. the decode grid (block_n, block_k, K
split for 1/2/4/8 waves, stages) with the best of those, at M = 1, then its best five at
M = 16; 3. prompt tiles at M = 64, 256. `--stages gemv`: the GEMV's grid at M = 1, its
best at M = 2..4, beside the tiled kernel's default and bf16 (session 46 ran it beside
session 45's GEMV, since removed: benchmarks/results/h100-session46-zzz11[01]-*/).
Prints each stage's ranking; the JSON holds every timing, the ceilings and the best
configs. A probe for choosing the `default_config`s, not a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import torch
import torch.nn.functional as F

from loom.bench.ceilings import measure_ceilings
from loom.bench.common import git_commit
from loom.bench.int4 import _weight, projections
from loom.bench.kernel_timing import KernelTimer
from loom.bench.moe_space import model_config_json
from loom.kernels import int4_gemv as gmod
from loom.kernels import int4_linear as kmod
from loom.kernels.compile_pool import compile_pool
from loom.quantization.int4 import dequantize


def split_for(steps: int, tiles: int, sms: int, waves: int) -> int:
    """The divisor of the K steps nearest `waves` programs per SM (at least 1)."""
    want = max(1, round(waves * sms / max(tiles, 1)))
    return min((d for d in range(1, steps + 1) if steps % d == 0),
               key=lambda d: (abs(d - want), d))


VARIANTS = [(False, 0), (False, 2), (True, 1), (True, 2)]
"""(slabs, convert): how each step unpacks the words (whole, or by value position) and
turns the values into bf16."""


def decode_grid(n, k, group, sms, variants, tiles=(32, 64, 128), block_ks=(64, 128),
                waves=(1, 2, 4, 8), stages=(2, 3)):
    out = []
    for slabs, convert in variants:
        for bn in tiles:
            for bk in block_ks:
                if group % bk or (slabs and bk < 128):  # slabs: a dot of bk / 8 >= 16
                    continue
                for w in waves:
                    split = split_for(k // bk, -(-n // bn), sms, w)
                    for st in stages:
                        out.append(kmod.Int4Config(16, bn, bk, split, 8 if bn == 128 else 4,
                                                   st, convert=convert, slabs=slabs))
    return list(dict.fromkeys(out))


def prompt_grid(group, variant):
    slabs, convert = variant
    bk = kmod.block_k_for(group) if slabs else min(64, kmod.block_k_for(group))
    out = []
    for bm, bn, warps in ((32, 64, 4), (64, 64, 4), (64, 128, 4), (128, 128, 8),
                          (64, 256, 8), (128, 64, 4)):
        for st in (3, 4):
            out.append(kmod.Int4Config(bm, bn, bk, 1, warps, st, convert=convert,
                                       slabs=slabs))
    return out


class Search:
    def __init__(self, args):
        self.args = args
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.timer = KernelTimer(self.device, 2, args.num_iters)
        self.gen = torch.Generator(device=self.device).manual_seed(0)
        self.shapes = projections(model_config_json(args.model), args.tp)
        self.weights = {name: _weight(n, k, args.group_size, False, self.device, self.gen)
                        for name, (n, k) in self.shapes.items()}
        self.rows: list[dict] = []
        self.deadline = time.perf_counter() + args.budget_s

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def call(self, x, name, cfg, compile_only=False):
        """The kernel a config belongs to (the GEMV's or the tiled one's) on x."""
        packed, scale, zero = self.weights[name]
        g = self.args.group_size
        if isinstance(cfg, gmod.GemvConfig):
            return gmod.int4_gemv(x, packed, scale, zero, g, 4, cfg.block_k, config=cfg,
                                  compile_only=compile_only)
        return kmod.int4_matmul(x, packed, scale, zero, g, config=cfg,
                                compile_only=compile_only)

    def run(self, name, m, configs, stage):
        """Compile every config ahead, then check and time each: [(us, config)] ranked."""
        packed, scale, zero = self.weights[name]
        n, k = self.shapes[name]
        x = torch.randn(m, k, device=self.device, generator=self.gen).to(torch.bfloat16)
        want = x.float() @ dequantize(packed, scale, zero, self.args.group_size).t()
        with compile_pool(16, ignore_errors=True):
            for cfg in configs:
                self.call(x, name, cfg, compile_only=True)
        ranked = []
        for cfg in configs:
            if self.left() < 0:
                print(f"  budget spent: {name} M={m} stops", flush=True)
                break
            try:
                got = self.call(x, name, cfg).float()
                err = float(((got - want).norm(dim=-1) / want.norm(dim=-1)).max())
                if not err < 2e-2:
                    raise ValueError(f"error {err:.3g}")
                us = self.timer.time_us(lambda: self.call(x, name, cfg))
            except Exception as e:  # a config that fails to compile or run is reported
                print(f"  {name} M={m} {cfg}: {type(e).__name__}: {str(e)[:120]}")
                continue
            ranked.append((us, cfg))
            self.rows.append({"stage": stage, "projection": name, "n": n, "k": k, "m": m,
                              "us": us, "config": dataclasses.asdict(cfg)})
        ranked.sort(key=lambda t: t[0])
        return ranked

    def peers(self, name, m):
        """(bf16 matmul us, dequantize + dense GEMM us) for a projection at M rows."""
        packed, scale, zero = self.weights[name]
        n, k = self.shapes[name]
        x = torch.randn(m, k, device=self.device, generator=self.gen).to(torch.bfloat16)
        dense = dequantize(packed, scale, zero, self.args.group_size).to(torch.bfloat16)
        g = self.args.group_size
        bf16 = self.timer.time_us(lambda: F.linear(x, dense))
        deq = self.timer.time_us(lambda: F.linear(
            x, kmod.dequantize_packed(packed, scale, zero, g)))
        self.rows.append({"stage": "peers", "projection": name, "n": n, "k": k, "m": m,
                          "bf16_us": bf16, "dequant_gemm_us": deq})
        return bf16, deq


def gemv_grid(n, k, group, sms):
    """Short steps inside a group (zzz110's grid, pruned to its good corner) and long
    steps over several groups (each row read in 256-2048 B runs a step)."""
    out = []
    forms = [(64, 128, 2), (128, 128, 2), (128, 128, 4)]
    forms += [(bn, bk, w) for bk in (256, 512, 1024, 2048) for bn, w in (
        (8, 1), (8, 2), (16, 2), (16, 4), (32, 2), (32, 4), (64, 4), (64, 8))]
    for bn, bk, warps in forms:
        if bk > group and (group & (group - 1) or bk % group) or k % bk:
            continue
        if bk < group and group % bk:
            continue
        for prefetch in (0, 1):
            for w in (4, 8, 16):
                split = split_for(k // bk, -(-n // bn), sms, w)
                out.append(gmod.GemvConfig(bn, bk, split, warps, 1, prefetch))
    return list(dict.fromkeys(out))


def weight_bytes(n, k, group):
    return n * k // 2 + n * (k // group) * 3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("-tp", type=int, default=1)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--num-iters", type=int, default=10)
    p.add_argument("--budget-s", type=float, default=300)
    p.add_argument("--out", required=True)
    p.add_argument("--stages", choices=("gemv", "all"), default="all",
                   help="gemv: the GEMV's search alone, beside the tiled kernel's default")
    args = p.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    ceilings = measure_ceilings(device)
    copy = ceilings.copy_tb_per_s * 1e12
    s = Search(args)
    print(f"{torch.cuda.get_device_name(device)} ({s.sms} SMs): copy "
          f"{ceilings.copy_tb_per_s:.2f} TB/s, bf16 {ceilings.matmul_tflop_per_s:.0f} TFLOP/s",
          flush=True)
    best: dict = {}

    def show(stage, name, m, ranked, top=5):
        n, k = s.shapes[name]
        floor_us = weight_bytes(n, k, args.group_size) / copy * 1e6
        for us, cfg in ranked[:top]:
            print(f"  [{stage}] {name} M={m}: {us:7.1f} us ({floor_us / us:.2f} of copy) "
                  f"{cfg}", flush=True)
        if ranked:
            best.setdefault(stage, {})[f"{name},{m}"] = {
                "us": ranked[0][0], "fraction_of_copy": floor_us / ranked[0][0],
                "config": dataclasses.asdict(ranked[0][1])}

    if args.stages == "gemv":
        gemv_stage(s, show)
    else:
        tiled_stages(s, show, args, best)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "int4_tune", "device": torch.cuda.get_device_name(device),
                   "git_commit": git_commit(), "command": "benchmarks/gpu/int4_tune.py "
                   + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()),
                   "ceilings": dataclasses.asdict(ceilings), "best": best,
                   "rows": s.rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


def gemv_stage(s, show):
    """The GEMV's grid at M = 1, its best five and the default at M = 2, 3, 4; the tiled
    kernel's default and bf16's matmul beside it; the tile's
    default at M = 1..16 (why 2..5 rows measured slower than 16)."""
    g = s.args.group_size
    for name, (n, k) in s.shapes.items():
        s.timer.spin()
        ranked = s.run(name, 1, gemv_grid(n, k, g, s.sms), "gemv")
        show("gemv", name, 1, ranked, top=8)
        for m in (2, 3, 4):
            cands = [c for _, c in ranked[:5]] + [gmod.default_config(m, n, k, g, min(g, 128),
                                                                      s.sms)]
            show("gemv", name, m, s.run(name, m, list(dict.fromkeys(cands)), "gemv"), top=3)
        for m in (1, 2, 3, 4):
            cfg = kmod.default_config(m, n, k, g, s.sms)
            show("tiled", name, m, s.run(name, m, [cfg], "tiled"), top=1)
        bf16, _ = s.peers(name, 1)
        print(f"  bf16 M=1 {bf16:.1f} us", flush=True)
    for name in ("qkv_proj", "gate_up_proj"):
        n, k = s.shapes[name]
        for m in (5, 8, 12, 16):
            cfg = kmod.default_config(m, n, k, g, s.sms)
            show("tiled", name, m, s.run(name, m, [cfg], "tiled"), top=1)


def tiled_stages(s, show, args, best):
    # 1. the unpacking and conversions at a few decode tiles
    totals = {v: 0.0 for v in VARIANTS}
    for name, (n, k) in s.shapes.items():
        s.timer.spin()
        grid = decode_grid(n, k, args.group_size, s.sms, VARIANTS, tiles=(64,),
                           block_ks=(128,), waves=(2, 8), stages=(3,))
        ranked = s.run(name, 1, grid, "convert")
        show("convert", name, 1, ranked, top=14)
        for v in totals:
            totals[v] += min((us for us, cfg in ranked if (cfg.slabs, cfg.convert) == v),
                             default=1e9)
    variant = min(totals, key=totals.get)
    print(f"(slabs, convert) totals (us, best tile each): {totals}; taking {variant}",
          flush=True)
    # 2. the decode grid at M = 1, its best five at M = 16
    for name, (n, k) in s.shapes.items():
        s.timer.spin()
        ranked = s.run(name, 1, decode_grid(n, k, args.group_size, s.sms, (variant,)),
                       "decode")
        show("decode", name, 1, ranked)
        bf16, deq = s.peers(name, 1)
        print(f"  bf16 M=1 {bf16:.1f} us", flush=True)
        ranked16 = s.run(name, 16, [cfg for _, cfg in ranked[:5]], "decode16")
        show("decode16", name, 16, ranked16, top=2)
    # 3. prompt tiles
    for m in (64, 256):
        for name in s.shapes:
            s.timer.spin()
            ranked = s.run(name, m, prompt_grid(args.group_size, variant), "prompt")
            show("prompt", name, m, ranked, top=3)
            bf16, deq = s.peers(name, m)
            print(f"  M={m} bf16 {bf16:.1f} us, dequantize + GEMM {deq:.1f} us", flush=True)
    best["variant_totals_us"] = {str(v): t for v, t in totals.items()}


if __name__ == "__main__":
    raise SystemExit(main())
