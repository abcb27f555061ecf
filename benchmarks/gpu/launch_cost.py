"""Host time per call of what an eagerly run decode layer launches (Llama-3.1-8B shapes,
batch 1, 160-token context, bf16): the attention op whole and its parts down to Triton's
launch of the decode kernel, and the eager norm and linear, against a two-argument Triton
kernel. Each is called N times back to back; host us/call is the loop's wall time over N,
GPU us/call from events around the same loop (host-bound where host > GPU)."""

import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import loom.kernels.paged_decode as pd
from loom.attention.backend import AttentionMetadata
from loom.attention.triton_backend import TritonBackend
from loom.forward_context import ForwardContext, forward_context
from loom.kernels.all_reduce_norm import add_rms_norm
from loom.kernels.gemv_decode import linear as loom_linear
from loom.layers.attention import attention_op
from loom.layers.norm import fused_add_rms_norm
from loom.layers.rotary import RotaryEmbedding

dev = torch.device("cuda")
assert attention_op is not None  # imported for its op, loom::attention
N = 2000


def cost(name, fn):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start_ev.record()
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    host = (time.perf_counter() - t0) / N * 1e6
    end_ev.record()
    torch.cuda.synchronize()
    gpu = start_ev.elapsed_time(end_ev) * 1e3 / N
    print(f"{name:58s} host {host:7.1f} us/call   loop on GPU {gpu:7.1f} us/call")


@triton.jit
def _tiny(x_ptr, n):
    tl.store(x_ptr + tl.arange(0, 16), tl.zeros([16], tl.float32), mask=tl.arange(0, 16) < n)


H, HKV, D, BS, CTX = 32, 8, 128, 16, 160
dt = torch.bfloat16
x16 = torch.zeros(16, device=dev)
cost("triton: 2-arg kernel[grid](...)", lambda: _tiny[(1,)](x16, 16))

qkv = torch.randn(1, (H + 2 * HKV) * D, device=dev, dtype=dt)
q2, k2, v2 = qkv.split([H * D, HKV * D, HKV * D], dim=1)
q, k, v = q2.view(1, H, D), k2.view(1, HKV, D), v2.view(1, HKV, D)
kv_cache = torch.zeros(2, 1024, BS, HKV, D, device=dev, dtype=dt)
rope = RotaryEmbedding(D, 8192, 500000.0).to(dev)
cos_sin = rope.cos_sin_cache
positions = torch.tensor([CTX - 1], device=dev)
blocks = -(-CTX // BS)
meta = AttentionMetadata(
    num_actual_tokens=1, num_reqs=1, max_query_len=1, max_seq_len=CTX,
    query_start_loc=torch.tensor([0, 1], device=dev, dtype=torch.int32),
    seq_lens=torch.tensor([CTX], device=dev, dtype=torch.int32),
    block_table=torch.arange(blocks, device=dev, dtype=torch.int32)[None],
    slot_mapping=torch.tensor([CTX - 1], device=dev, dtype=torch.int64),
    query_start_loc_cpu=torch.tensor([0, 1], dtype=torch.int32),
    seq_lens_cpu=torch.tensor([CTX], dtype=torch.int32))
backend = TritonBackend()
scale = D ** -0.5
ctx = ForwardContext(meta, [kv_cache], backend)
with forward_context(ctx):
    cost("torch.ops.loom.attention (decode, rope fused)", lambda: torch.ops.loom.attention(
        q2, k2, v2, 0, scale, positions, cos_sin))
cost("TritonBackend.decode_rope", lambda: backend.decode_rope(
    q, k, v, positions, cos_sin, kv_cache, meta, scale))
tiles = backend.decode_tiles(1, HKV, D, dt, dt)
splits = backend.decode_splits(1, HKV, CTX, tiles, dt)
print(f"decode tiles {tiles}, splits {splits}")
new = pd.NewTokens(k, v, positions, cos_sin, meta.slot_mapping, None)
out = torch.empty_like(q)


def paged(num_splits):
    return lambda: pd.paged_decode(q, kv_cache, out, meta.block_table, meta.query_start_loc,
                                   meta.seq_lens, 1, scale, num_splits, block_n=tiles.block_n,
                                   num_warps=tiles.num_warps, num_stages=tiles.num_stages,
                                   new_tokens=new)


cost(f"paged_decode ({splits} splits)", paged(splits))
cost("paged_decode (1 split)", paged(1))

# The raw launch paged_decode makes, with the same arguments.
captured = {}
real = pd.launch_or_compile


def recording(kernel, grid, compile_only):
    launch = real(kernel, grid, compile_only)

    def call(*args, **kwargs):
        captured.update(kernel=kernel, grid=grid, args=args, kwargs=kwargs)
        return launch(*args, **kwargs)
    return call


pd.launch_or_compile = recording
paged(splits)()
pd.launch_or_compile = real
kern, grid, args, kwargs = (captured[key] for key in ("kernel", "grid", "args", "kwargs"))
cost(f"_decode_split_kernel[grid](...) ({len(args)} args + {len(kwargs)} kw)",
     lambda: kern[grid](*args, **kwargs))
compiled = kern[grid](*args, **kwargs)
device_caches = kern.device_caches[torch.cuda.current_device()]
binder = device_caches[4]
cost("  Triton's binder alone", lambda: binder(*args, **kwargs))
bound = list(binder(*args, **kwargs)[0].values())
stream = torch.cuda.current_stream().cuda_stream
g = tuple(grid) + (1,) * (3 - len(grid))


def direct():
    compiled.run(g[0], g[1], g[2], stream, compiled.function, compiled.packed_metadata, None,
                 None, None, *bound)


cost("  CompiledKernel.run direct (bound args)", direct)
cost("torch.empty(1, 32, 4, fp32)", lambda: torch.empty(1, 32, 4, device=dev))
cost("torch.empty_like(q)", lambda: torch.empty_like(q))
h = torch.randn(1, 4096, device=dev, dtype=dt)
res = torch.randn(1, 4096, device=dev, dtype=dt)
w = torch.ones(4096, device=dev, dtype=dt)
cost("eager fused_add_rms_norm (torch ops)", lambda: fused_add_rms_norm(h, res, w, 1e-5))
cost("add_rms_norm (loom's Triton kernel)", lambda: add_rms_norm(h, res, w, 1e-5))
wqkv = torch.randn((H + 2 * HKV) * D, 4096, device=dev, dtype=dt)
cost("F.linear [1, 4096] x qkv", lambda: F.linear(h, wqkv))
cost("loom linear (GEMV table) [1, 4096] x qkv", lambda: loom_linear(h, wqkv))
