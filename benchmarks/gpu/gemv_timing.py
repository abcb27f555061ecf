"""gemv_bench.py's timing and what is read from it: one candidate checked against F.linear
(fp8 weights: the exact product in float32) and timed in a CUDA graph; the summary lines;
the winners merged into loom's decode table.

torch is passed in (it is imported once CUDA is known to be there), not imported here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics

CALLS_PER_GRAPH = 20
REPLAYS = 10
POOL_BYTES = 256 << 20


def log(msg: str) -> None:
    print(msg, flush=True)


# ----------------------------------------------------------------------------------------
# Timing

def graph_us(torch, call) -> tuple[float, float]:
    """call(i) issues call i; CALLS_PER_GRAPH calls in one graph; (median, min) us per
    call over REPLAYS replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream (cuBLAS workspaces)
        for i in range(3):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS_PER_GRAPH):
            call(i)
    graph.replay()
    graph.replay()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(REPLAYS)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    per_call = [s.elapsed_time(e) * 1e3 / CALLS_PER_GRAPH for s, e in events]
    del graph
    return statistics.median(per_call), min(per_call)


def close_enough(torch, y, ref, norm_tol: float = 1e-2,
                 max_tol: float = 5e-2) -> tuple[bool, float, float]:
    """bf16 tolerance: both sides round y to bf16 from float32 sums (~3e-3 of the norm).
    Against an exact float32 reference (fp8 weights) only y's rounding is left: ~1e-3 of
    the norm, each element within 2^-9 of itself, so FP8_TOL's tighter bounds."""
    y32, r32 = y.float(), ref.float()
    if not bool(torch.isfinite(y32).all()):
        return False, float("nan"), float("nan")
    diff = y32 - r32
    norm = (diff.norm() / r32.norm()).item()
    worst = (diff.abs().max() / r32.abs().max()).item()
    return norm < norm_tol and worst < max_tol, norm, worst


FP8_TOL = {"norm_tol": 5e-3, "max_tol": 2e-2}


class Shape:
    """One weight shape and its pool of copies; fp8 when scales (float32 [N, 1] per copy)
    are given. The baseline is F.linear (down+silu: F.silu(gate) * up first) for bf16, and
    for fp8 what loom runs without a GEMV config, `scaled_mm_linear` (after `silu_mul`)."""

    def __init__(self, name: str, n: int, k: int, silu: bool, pool_w, scales=None):
        self.name, self.n, self.k, self.silu = name, n, k, silu
        self.weights = pool_w
        self.scales = scales
        self.fp8 = scales is not None
        # fp8: a byte a weight, and the scales the kernel reads too
        self.bytes = n * k + n * 4 if self.fp8 else n * k * 2

    def inputs(self, torch, m):
        cols = 2 * self.k if self.silu else self.k
        return torch.randn(m, cols, device="cuda", dtype=torch.bfloat16)

    def copy(self, i: int):
        """(weight, its scale or None) of copy i (mod the pool)."""
        i %= len(self.weights)
        return self.weights[i], self.scales[i] if self.fp8 else None

    def torch_call(self, torch, F, x, i: int = 0):
        """The baseline on copy i."""
        w, ws = self.copy(i)
        if self.fp8:
            from loom.kernels.fp8_linear import scaled_mm_linear
            from loom.kernels.silu_mul import silu_mul
            return scaled_mm_linear(silu_mul(x) if self.silu else x, w, ws)
        if self.silu:
            return F.linear(F.silu(x[:, :self.k]) * x[:, self.k:], w)
        return F.linear(x, w)

    def reference(self, torch, F, x):
        """What a candidate on copy 0 is checked against: the baseline for bf16; for fp8
        act.float() @ (w.float() * ws).T, the scale applied after the sums (the same
        product; each factor exact even in TF32), act = x or `silu_mul(x)` (the kernel's
        rounding of silu(gate) * up, torch eager's), not the baseline, which quantizes x
        (~4e-2 off)."""
        if not self.fp8:
            return self.torch_call(torch, F, x)
        from loom.kernels.silu_mul import silu_mul
        w, ws = self.copy(0)
        act = silu_mul(x) if self.silu else x
        return (act.float() @ w.float().T) * ws.reshape(1, -1)

    def gemv_call(self, gemv, x, i: int, cfg):
        w, ws = self.copy(i)
        return gemv(x, w, silu_mul_input=self.silu, weight_scale=ws, config=cfg)


def time_candidate(torch, F, gemv, shape: Shape, m: int, cfg, entry: dict) -> None:
    desc = cfg.describe()
    if desc in entry["candidates"]:
        return
    rec = {"config": dataclasses.asdict(cfg)}
    entry["candidates"][desc] = rec
    try:
        x = shape.inputs(torch, m)
        poison = torch.full((m, shape.n), float("nan"), device="cuda", dtype=torch.bfloat16)
        del poison  # y below most likely reuses its block: an unwritten element shows
        y = shape.gemv_call(gemv, x, 0, cfg)
        ok, norm, worst = close_enough(torch, y, shape.reference(torch, F, x),
                                       **(FP8_TOL if shape.fp8 else {}))
        rec.update(err_norm=norm, err_max=worst)
        if not ok:
            against = "the float32 product" if shape.fp8 else "F.linear"
            rec["error"] = (f"mismatch against {against}: rel norm {norm:.2e}, max "
                            f"{worst:.2e}")
            log(f"  note: {shape.name} M={m} {desc}: {rec['error']}; skipped")
            return
        x = shape.inputs(torch, m)
        rec["us"], rec["min_us"] = graph_us(torch, lambda i: shape.gemv_call(gemv, x, i, cfg))
    except Exception as e:  # noqa: BLE001 - a config that fails is reported and skipped
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        log(f"  note: {shape.name} M={m} {desc}: {rec['error']}; skipped")


def ranked(entry: dict) -> list[tuple[float, dict]]:
    """The timed candidates of one (shape, M), fastest first: (us, config fields)."""
    return sorted(((c["us"], c["config"]) for c in entry["candidates"].values()
                   if c.get("us") is not None), key=lambda t: t[0])


# ----------------------------------------------------------------------------------------
# Summary (it also records each entry's "best", "torch_eff" and "best_by_family_us")

def log_summary(results: dict, gemv_config, copy_tbps: float, names: list[str],
                fp8: bool = False) -> None:
    log("")
    log(f"copy rate {copy_tbps:.2f} TB/s; eff = floor / time (floor = weight bytes / copy "
        f"rate); {CALLS_PER_GRAPH} calls a graph, median of {REPLAYS} replays")
    if fp8:
        log("fp8 weights (+ their float32 scales in the bytes); the baseline column is "
            "scaled_mm_linear (per-token quantization + torch._scaled_mm)")
    base = "scaledmm" if fp8 else "cuBLAS"
    log(f"{'shape':10} {'M':>2} {'MB':>6} {'floor':>7} | {base:>8} {'eff':>5} | "
        f"{'Triton':>8} {'eff':>5} {'speedup':>7} | best config")
    for e in results.values():
        log(best_line(e, gemv_config))
    log("")
    log("best per family (us): reg = row reductions from register loads (num_stages 1), "
        "pipe = the same through an async-copy pipeline, dot = tensor cores; split = any "
        "with split_k > 1")
    for e in results.values():
        log(family_line(e))
    if "down+silu" in names:
        first = "silu_mul then scaled_mm_linear" if fp8 \
            else "F.silu(gate) * up then F.linear (3 kernels)"
        log(f"down+silu: the torch column is {first}; the Triton one is the fused kernel")


def best_line(e: dict, gemv_config) -> str:
    """One (shape, M)'s floor, cuBLAS and best Triton config; sets e's best and torch_eff."""
    best = ranked(e)
    e["best"] = None
    e["torch_eff"] = e["floor_us"] / e["torch_us"]
    line = (f"{e['shape']:10} {e['M']:>2} {e['weight_bytes'] / 1e6:6.1f} "
            f"{e['floor_us']:6.2f}u | {e['torch_us']:7.2f}u {e['torch_eff']:5.2f} |")
    if not best:
        return line + " no Triton candidate passed"
    us, cfg = best[0]
    desc = gemv_config(**cfg).describe()
    e["best"] = {"us": us, "config": cfg, "describe": desc,
                 "eff": e["floor_us"] / us, "speedup_vs_torch": e["torch_us"] / us}
    line += (f" {us:7.2f}u {e['floor_us'] / us:5.2f} {e['torch_us'] / us:6.2f}x | "
             f"{desc}")
    unsplit = [u for u, c in best if c["split_k"] == 1]
    if unsplit and unsplit[0] != us:
        line += f"  (best unsplit: {unsplit[0]:.2f}u)"
    return line


def family_line(e: dict) -> str:
    """One (shape, M)'s best time per kernel family; sets e's best_by_family_us."""
    fams = {}
    for us, cfg in ranked(e):
        fam = ("split" if cfg["split_k"] > 1 else "dot" if cfg["use_dot"]
               else "reg" if cfg["num_stages"] == 1 else "pipe")
        fams.setdefault(fam, us)
    e["best_by_family_us"] = fams
    return f"{e['shape']:10} {e['M']:>2}  " + "  ".join(
        f"{fam} {fams[fam]:7.2f}" if fam in fams else f"{fam} {'-':>7}"
        for fam in ("reg", "pipe", "dot", "split"))


# ----------------------------------------------------------------------------------------
# The decode table

def write_table(results: dict, path: str, margin: float = 0.98) -> str:
    """Merge the winners into loom's decode table (loom.kernels.gemv_decode.tuned_config reads
    it): per (N, K) and M, the fastest unsplit config that checked out where it beat the
    baseline (F.linear; in a run on fp8 weights, whose table is the fp8 one,
    scaled_mm_linear) by more than the margin, else null (the baseline, so that the row
    counts below do not take a larger M's config). Fused-SwiGLU rows are not written: the
    model's SiLU-fused down projection takes the plain row's config, where it reduces rows
    (`loom.kernels.gemv_decode.decode_silu_mul_linear`)."""
    table = json.load(open(path)) if os.path.exists(path) else {}
    for r in results.values():
        if r["silu_mul"]:
            continue
        ok = [c for c in r["candidates"].values()
              if c.get("us") and c["config"]["split_k"] == 1 and c.get("err_norm", 1) < 1e-2]
        if not ok:
            continue
        best = min(ok, key=lambda c: c["us"])
        per_m = table.setdefault(f"{r['N']},{r['K']}", {})
        if best["us"] < r["torch_us"] * margin:
            per_m[str(r["M"])] = {k: v for k, v in best["config"].items()
                                  if k not in ("split_k", "split_mode")}
        else:
            per_m[str(r["M"])] = None
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
    return path
