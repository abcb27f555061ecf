"""A/B of the fused MoE GEMV's integer path on one GPU: session 46's form (values as the
floats 128 + q, per-thread sums until the loop ends; loom/kernels/moe_gemv.py) against
the form before it (values unpacked whole, converted, and reduced across threads every
chunk), alternated, on
Qwen3-30B-A3B's experts (hidden 2048, intermediate 768, top 8, groups of 128, zero
points), int4 and 8-bit, at 1, 2 and 4 tokens, with the H200 table's two decode chunks.
Each call is checked against the float64 reference before it is timed (CUDA graph
replays, L2 flushed: KernelTimer); bytes are the selected experts' weights.

  git show 102aae1:loom/kernels/moe_gemv.py > benchmarks/gpu/moe_gemv_old.py  # first,
  python3 benchmarks/gpu/moe_gemv_ab.py --out ab.json      # here: the device has no git
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os

import torch

from loom.bench.ceilings import measure_ceilings
from loom.bench.common import git_commit
from loom.bench.kernel_timing import KernelTimer
from loom.kernels import fused_moe as fm
from tests.kernels.test_fused_moe_int4 import make_int4_moe

HIDDEN, INTER, TOP_K, GROUP, EXPERTS = 2048, 768, 8, 128, 16


def _old_launches():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "moe_gemv_old.py")
    if not os.path.exists(path):
        raise SystemExit(f"{path} is missing: git show 102aae1:loom/kernels/moe_gemv.py > it "
                         "before the run (the former form, untracked)")
    spec = importlib.util.spec_from_file_location("moe_gemv_old", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.moe_gemv_launches


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--num-iters", type=int, default=20)
    args = p.parse_args()
    device = torch.device("cuda", torch.cuda.current_device())
    ceilings = measure_ceilings(device)
    copy = ceilings.copy_tb_per_s * 1e12
    timer = KernelTimer(device, 2, args.num_iters)
    forms = {"new": fm.moe_gemv_launches, "old": _old_launches()}
    rows = []
    print(f"{torch.cuda.get_device_name(device)}: copy {ceilings.copy_tb_per_s:.2f} TB/s",
          flush=True)
    for bits in (4, 8):
        for tokens in (1, 2, 4):
            moe_args, quant, want = make_int4_moe(tokens, HIDDEN, INTER, EXPERTS, TOP_K,
                                                  GROUP, True, torch.bfloat16, bits)
            experts = int(moe_args[4].unique().numel())
            nbytes = experts * 3 * HIDDEN * INTER * (bits / 8 + 3 / GROUP)
            for block_n, block_k, stages in ((8, 512, 3), (4, 1024, 2)):
                tiles = dict(gemv=1, block_n=block_n, block_k=block_k, num_warps=4,
                             num_stages=stages)
                timer.spin()
                for rep in range(2):  # alternated: new, old, new, old
                    for name, launches in forms.items():
                        fm.moe_gemv_launches = launches
                        try:
                            got = fm.fused_moe(*moe_args, **quant, **tiles)
                            err = float((got.double().cpu() - want).abs().max()
                                        / want.abs().max())
                            if not err < 2e-2:
                                raise ValueError(f"error {err:.3g}")
                            us = timer.time_us(lambda: fm.fused_moe(*moe_args, **quant,
                                                                    **tiles))
                        finally:
                            fm.moe_gemv_launches = forms["new"]
                        rows.append({"form": name, "bits": bits, "tokens": tokens,
                                     "experts_read": experts, "block_n": block_n,
                                     "block_k": block_k, "num_stages": stages, "us": us,
                                     "fraction_of_copy": nbytes / copy / (us * 1e-6)})
                        print(f"  int{bits} T={tokens} ({experts} experts) {block_n}x{block_k}"
                              f" {name}: {us:7.1f} us ({nbytes / copy / (us * 1e-6):.2f} of "
                              "copy)", flush=True)
    with open(args.out, "w") as f:
        json.dump({"benchmark": "moe_gemv_ab", "device": torch.cuda.get_device_name(device),
                   "git_commit": git_commit(), "command": "benchmarks/gpu/moe_gemv_ab.py",
                   "ceilings": dataclasses.asdict(ceilings), "rows": rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
