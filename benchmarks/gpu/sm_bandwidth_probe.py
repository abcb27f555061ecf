"""How fast can a few SMs read HBM? The bound on an SM partition for issue 3's throughput.

run_zzz133 found a step's prompt GEMMs and its decodes' attention gain nothing on two
streams, because each fills the GPU. A partition would hold the GEMMs to 132 - s SMs and
leave s to attention's KV reads. It pays only if s SMs read at a large share of the copy
rate. Here a persistent Triton kernel of s programs (one per SM) reads a 2 GiB buffer once,
summing it, for s from 8 to all SMs. It also times a bf16 matmul beside the kernel on
another stream, to see what the matmul loses to the reader. Last, the same read through TMA
tiles a few deep (more bytes in flight a program): how few SMs can keep up with the copy
(run_zzz137: the plain reader's ~30 GB/s an SM starves attention held to a few SMs).

    python3 sm_bandwidth_probe.py OUT.json
"""
import dataclasses
import json
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from loom.bench.ceilings import measure_ceilings
from loom.bench.common import git_commit, now_iso
from loom.bench.kernel_timing import KernelTimer


@triton.jit
def _read(src, out, n_blocks, ITERS: tl.constexpr, BLOCK: tl.constexpr):
    pid, programs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ITERS):
        b = pid + i * programs
        offs = b.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(src + offs, mask=offs < n_blocks * BLOCK, other=0.0).to(tl.float32)
    tl.store(out + pid, tl.sum(acc))


@triton.jit
def _read_tiles(desc, out, ITERS: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr):
    """The same read in [ROWS, COLS] tiles through a TMA descriptor, which the launch's
    num_stages keeps several deep: more bytes in flight a program than _read's loads."""
    pid, programs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for i in range(ITERS):
        acc += desc.load([(pid + i * programs) * ROWS, 0]).to(tl.float32)  # past the end: 0
    tl.store(out + pid, tl.sum(acc))


dev = torch.device("cuda")
ceil = measure_ceilings(dev)
timer = KernelTimer(dev, warmup=2, iters=10)
timer.spin(1.0)
sms = torch.cuda.get_device_properties(dev).multi_processor_count
BLOCK = 8192
src = torch.randn(1 << 30, device=dev, dtype=torch.bfloat16)  # 2 GiB
out = torch.empty(sms, device=dev, dtype=torch.float32)
n_blocks = src.numel() // BLOCK
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
side = torch.cuda.Stream()


def read(s):
    _read[(s,)](src, out, n_blocks, ITERS=triton.cdiv(n_blocks, s), BLOCK=BLOCK, num_warps=8)


def both(s, matmuls):
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        read(s)
    for _ in range(matmuls):
        a @ a
    main.wait_stream(side)


rows = []
mm_us = timer.time_us(lambda: a @ a)
mm_tflops = 2 * 8192 ** 3 / mm_us / 1e6
print(f"matmul 8192^3 alone: {mm_us:.1f} us, {mm_tflops:.0f} TFLOP/s", flush=True)
for s in sorted({8, 16, 24, 32, 48, 66, 99, sms}):
    us = timer.time_us(lambda: read(s))
    tbps = src.numel() * src.element_size() / us / 1e6
    row = {"programs": s, "read_us": us, "read_tb_per_s": tbps,
           "fraction_of_copy": tbps / ceil.copy_tb_per_s}
    # as many matmuls as the read takes alone, so that the two overlap throughout
    k = max(1, round(us / mm_us))
    both_us = timer.time_us(lambda: both(s, k))
    row.update(matmuls_beside=k, both_us=both_us, sequential_us=us + k * mm_us,
               both_over_sequential=both_us / (us + k * mm_us))
    rows.append(row)
    print(f"{s:4d} programs: {tbps:5.2f} TB/s ({row['fraction_of_copy']:.2f} of copy); "
          f"beside {k} matmuls {both_us:9.1f} us against {us + k * mm_us:9.1f} one after "
          f"the other ({row['both_over_sequential']:.3f}x)", flush=True)
# how many SMs a deeper reader needs to keep up with the copy: TMA tiles, a few deep
COLS = 256
flat = src.view(-1, COLS)
for rows_, stages in ((64, 4), (128, 3)):
    desc = TensorDescriptor.from_tensor(flat, [rows_, COLS])
    for s in (8, 16, 24, 32, 48, 66, sms):
        def read_tiles():
            _read_tiles[(s,)](desc, out, ITERS=triton.cdiv(flat.shape[0], rows_ * s),
                              ROWS=rows_, COLS=COLS, num_stages=stages, num_warps=8)
        us = timer.time_us(read_tiles)
        tbps = src.numel() * src.element_size() / us / 1e6
        rows.append({"reader": f"tma {rows_}x{COLS}, {stages} stages", "programs": s,
                     "read_us": us, "read_tb_per_s": tbps,
                     "fraction_of_copy": tbps / ceil.copy_tb_per_s})
        print(f"tma {rows_}x{COLS}x{stages} {s:4d} programs: {tbps:5.2f} TB/s "
              f"({rows[-1]['fraction_of_copy']:.2f} of copy)", flush=True)
json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "git_commit": git_commit(), "date": now_iso(),
           "command": " ".join(["python3"] + sys.argv), "ceilings": dataclasses.asdict(ceil),
           "sms": sms, "matmul_us": mm_us, "matmul_tflop_per_s": mm_tflops, "rows": rows},
          open(sys.argv[1], "w"), indent=1)
