"""gemv_bench.py's search: the candidate configs of each stage, and the pool of worker
processes that compiles them ahead of the timing (into Triton's on-disk cache).

The workers are spawned, so the functions they run live here, in a module that they import
by name: gemv_bench.py puts this folder on sys.path, and a spawned worker gets the parent's
sys.path (and re-runs gemv_bench.py's top level as `__mp_main__`).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import time

from gemv_timing import log, ranked

DOT_TILES = [(16, 128), (16, 256), (32, 128), (32, 256), (64, 128), (64, 256), (128, 128)]


# ----------------------------------------------------------------------------------------
# Candidates

def fma_tiles(m: int, w_bytes: int = 2) -> list[tuple[int, int, int]]:
    """(block_n, block_k, num_warps) of the row-reduction path within a register budget:
    16 to 128 bytes of weight per thread (64 at M = 4, whose products keep more live), that
    is 8 to 64 bf16 elements, 16 to 128 fp8 ones (w_bytes 1: one 16-byte load holds 16, so
    the chunks go to 2048 wide). None past 4 rows: there each chunk's M unrolled row
    reductions would cost more than the tensor-core tiles, which take 16 rows for the price
    of one."""
    if m > 4:
        return []
    bmax = 128 if m <= 2 else 64
    widths = (128, 256, 512, 1024) + ((2048,) if w_bytes == 1 else ())
    out = []
    for warps in (4, 8):
        for bn in (8, 16, 32, 64):
            for bk in widths:
                if 16 <= bn * bk * w_bytes // (32 * warps) <= bmax:
                    out.append((bn, bk, warps))
    return out


def dot_tiles(w_bytes: int = 2) -> list[tuple[int, int]]:
    """The tensor-core tiles: fp8's (w_bytes 1) at twice the chunk width, the same weight
    bytes a chunk (as gemv_decode.weight_config widens the bf16 table's tiles for fp8)."""
    return DOT_TILES if w_bytes == 2 else [(bn, 2 * bk) for bn, bk in DOT_TILES]


def fits(cfg, k: int, w_bytes: int = 2) -> bool:
    """Even slices of whole chunks (no masked tail), and shared memory for the pipeline: the
    weight's rows, and with use_dot the 16 bf16 rows of x."""
    if k % (cfg.split_k * cfg.block_k):
        return False
    row_bytes = cfg.block_n * w_bytes + (16 * 2 if cfg.use_dot else 0)
    return max(cfg.num_stages - 1, 1) * row_bytes * cfg.block_k <= 160 * 1024


def stage1(gemv_config, k: int, w_bytes: int = 2) -> list:
    cands = [gemv_config(block_n=bn, block_k=bk, num_warps=w, num_stages=s)
             for bn, bk, w in fma_tiles(1, w_bytes) for s in (1, 3)]
    cands += [gemv_config(block_n=bn, block_k=bk, num_warps=4, num_stages=s, use_dot=True)
              for bn, bk in dot_tiles(w_bytes) for s in (3, 4)]
    return [c for c in cands if fits(c, k, w_bytes)]


def stage2(gemv_config, k: int, m: int, m1_entry: dict, w_bytes: int = 2) -> list:
    best = ranked(m1_entry)
    fma = [c for _, c in best if not c["use_dot"]][:4]
    emax_ok = {(bn, bk, w) for bn, bk, w in fma_tiles(m, w_bytes)}
    cands = [gemv_config(**c) for c in fma if (c["block_n"], c["block_k"], c["num_warps"])
             in emax_ok]
    if len(cands) < 2:  # the M = 1 winners are too large for M's registers: next best
        cands += [gemv_config(**c) for _, c in best if not c["use_dot"]
                  and (c["block_n"], c["block_k"], c["num_warps"]) in emax_ok][:3]
    cands += [gemv_config(block_n=bn, block_k=bk, num_warps=4, num_stages=s, use_dot=True)
              for bn, bk in dot_tiles(w_bytes) for s in (3, 4)]
    return [c for c in dict.fromkeys(cands) if fits(c, k, w_bytes)]


def stage2_without_m1(gemv_config, k: int, m: int, w_bytes: int = 2) -> list:
    """Stage 2 when M = 1 was not run: stage 1's dot tiles, and its row-reduction tiles
    that fit M's registers."""
    return [c for c in stage1(gemv_config, k, w_bytes)
            if c.use_dot or (c.block_n, c.block_k, c.num_warps) in set(fma_tiles(m, w_bytes))]


def stage3(gemv_config, k: int, entry: dict, trim: bool, w_bytes: int = 2) -> list:
    best = [c for _, c in ranked(entry) if c["split_k"] == 1][:2]
    if not best:
        return []
    rep = dataclasses.replace
    top = gemv_config(**best[0])
    cands = []
    if not trim:
        stages = (2, 3, 4) if top.use_dot else (1, 2, 3, 4)
        cands += [rep(top, num_stages=s) for s in stages if s != top.num_stages]
    def split(cfg, s, mode):
        """cfg cut into s slices of K, its chunk halved (not below 64) until they divide K
        (K = 7168 = 7 * 1024 takes 2 x 512 or 4 x 256, not 1024-wide chunks)."""
        bk = cfg.block_k
        while k % (s * bk) and bk > 64:
            bk //= 2
        return rep(cfg, block_k=bk, split_k=s, split_mode=mode)

    modes = ("fixup",) if trim else ("fixup", "reduce")
    cands += [split(top, s, mode) for s in (2, 4) for mode in modes]
    if not trim:
        cands.append(split(top, 2, "atomic"))
        if len(best) > 1:
            second = gemv_config(**best[1])
            cands += [split(second, s, "fixup") for s in (2, 4)]
    return [c for c in dict.fromkeys(cands) if fits(c, k, w_bytes)]


# ----------------------------------------------------------------------------------------
# Compiles in worker processes (they fill Triton's disk cache; the main process loads)

def _worker_init() -> None:
    os.environ.setdefault("TRITON_INTERPRET", "0")
    import torch
    importlib.import_module("loom.kernels.gemv")  # loaded once per worker, before its jobs
    torch.cuda.init()


def _worker_compile(job):
    """Run the config once on a tiny weight of the same K (N = 64: the same divisibility
    specializations as every benchmarked N) and dtype (fp8: with its float32 scale per row,
    as the timing passes it), which compiles it into the disk cache."""
    import torch
    from loom.kernels.gemv import GemvConfig, gemv
    m, k, silu, w_dtype, fields = job
    t0 = time.perf_counter()
    try:
        x = torch.randn(m, 2 * k if silu else k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
        ws = None
        if w_dtype == "fp8":
            w = w.to(torch.float8_e4m3fn)
            ws = torch.rand(64, 1, device="cuda", dtype=torch.float32)
        gemv(x, w, silu_mul_input=silu, weight_scale=ws, config=GemvConfig(**dict(fields)))
        torch.cuda.synchronize()
        return job, None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported, the config skipped
        return job, f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", \
            time.perf_counter() - t0


def _worker_ping() -> int:
    time.sleep(0.5)  # keeps this worker busy so that the next ping starts another
    return os.getpid()


class Compiler:
    def __init__(self, jobs: int):
        self.pool = None
        self.failed: dict = {}
        self.seconds = 0.0
        if jobs > 1:
            import concurrent.futures as cf
            import multiprocessing as mp
            try:
                self.pool = cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn"),
                                                   initializer=_worker_init)
                # Start every worker now (each imports torch and makes a CUDA context);
                # they are ready by the first stage's compiles.
                self.warming = [self.pool.submit(_worker_ping) for _ in range(jobs)]
            except Exception as e:  # noqa: BLE001
                log(f"note: no compile pool ({e}); compiling in the timing process")
                self.pool = None

    def run(self, jobs: list) -> None:
        jobs = [j for j in dict.fromkeys(jobs) if j not in self.failed]
        if self.pool is None or not jobs:
            return
        t0 = time.perf_counter()
        try:
            for job, err, _ in self.pool.map(_worker_compile, jobs, chunksize=1):
                if err:
                    self.failed[job] = err
        except Exception as e:  # noqa: BLE001
            log(f"note: compile pool failed ({type(e).__name__}: {e}); compiling in the "
                f"timing process from now on")
            self.pool.shutdown(cancel_futures=True)
            self.pool = None
        self.seconds += time.perf_counter() - t0
        log(f"  compiled {len(jobs)} configs in {time.perf_counter() - t0:.1f} s "
            f"({len(self.failed)} failed so far)")

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def job_key(m: int, k: int, silu: bool, cfg, w_dtype: str = "bf16") -> tuple:
    """A compile job, hashable and picklable: (M, K, silu, the weight's dtype ("bf16" or
    "fp8"), the config's fields)."""
    return (m, k, silu, w_dtype, tuple(sorted(dataclasses.asdict(cfg).items())))
