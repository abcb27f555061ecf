"""Host time per call, A against B alternated in one process (rounds of N calls, medians of
ROUNDS), for what an eagerly run layer launches: Llama-3.1-8B shapes, batch 1, a 160-token
context (decode) and a 128-token prompt, bf16. A is what main did before session 31
(Triton's kernel[grid], the attention op through the dispatcher), B is now with
LOOM_FAST_LAUNCH=1 (fast_launch, the Python implementation called directly). On a loaded or
throttled host each round moves; the alternation keeps both sides under the same
conditions."""

import os
import statistics
import time

import torch

from loom.attention.triton_backend import TritonBackend
from loom.bench.attention_workload import AttentionShape, Step, make_inputs
from loom.forward_context import ForwardContext, forward_context
from loom.kernels.all_reduce_norm import add_rms_norm
from loom.kernels.paged_decode import NewTokens, paged_decode
from loom.kernels.rope_kv_write import rope_write_kv_cache
from loom.layers.attention import attention_op
from loom.layers.rotary import RotaryEmbedding

dev = torch.device("cuda")
N, ROUNDS = 400, 9
H, HKV, D, BS = 32, 8, 128, 16
SHAPE = AttentionShape(H, HKV, D)
dt = torch.bfloat16


def host_us(fn) -> float:
    start = time.perf_counter()
    for _ in range(N):
        fn()
    return (time.perf_counter() - start) / N * 1e6


def ab(name, a, b, env_a=None):
    """env_a: LOOM_FAST_LAUNCH's value for side A (B runs with it 1)."""
    ra, rb = [], []
    for _ in range(ROUNDS):
        for side, fn, out in (("a", a, ra), ("b", b, rb)):
            if side == "a" and env_a is not None:
                os.environ["LOOM_FAST_LAUNCH"] = env_a
            else:
                os.environ["LOOM_FAST_LAUNCH"] = "1"
            fn()
            torch.cuda.synchronize()
            out.append(host_us(fn))
            torch.cuda.synchronize()
    os.environ.pop("LOOM_FAST_LAUNCH", None)
    ma, mb = statistics.median(ra), statistics.median(rb)
    print(f"{name:52s} before {ma:6.1f}  now {mb:6.1f} us/call  ({mb / ma:.2f}x; rounds "
          f"{min(ra):.0f}-{max(ra):.0f} / {min(rb):.0f}-{max(rb):.0f})")


cos_sin = RotaryEmbedding(D, 8192, 500000.0).to(dev).cos_sin_cache
scale = D ** -0.5
backend = TritonBackend()
for tokens, ctx in ((1, 160), (128, 128)):
    qkv = torch.randn(tokens, (H + 2 * HKV) * D, device=dev, dtype=dt)
    q2, k2, v2 = qkv.split([H * D, HKV * D, HKV * D], dim=1)
    positions = torch.arange(ctx - tokens, ctx, device=dev)
    # The bench's step builder: its slot mapping is all -1, so the cache is never written.
    inputs = make_inputs(Step((tokens,), (ctx,)), SHAPE, BS, dt, dev, seed=0)
    meta, kv_cache = inputs.meta, inputs.kv_cache
    what = "decode" if tokens == 1 else f"{tokens}-token prompt"
    with forward_context(ForwardContext(meta, [kv_cache], backend)):
        ab(f"attention op, {what}",
           lambda: torch.ops.loom.attention(q2, k2, v2, 0, scale, positions, cos_sin),
           lambda: attention_op(q2, k2, v2, 0, scale, positions, cos_sin), env_a="0")
    q, k, v = (t.view(tokens, -1, D) for t in (q2, k2, v2))
    if tokens == 1:
        out = torch.empty_like(q)
        new = NewTokens(k, v, positions, cos_sin, meta.slot_mapping, None)
        decode = lambda: paged_decode(q, kv_cache, out, meta.block_table,  # noqa: E731
                                      meta.query_start_loc, meta.seq_lens, 1, scale, 2,
                                      block_n=128, num_warps=4, num_stages=3, new_tokens=new)
        ab("paged_decode (2 splits, rope fused)", decode, decode, env_a="0")
    else:
        rope = lambda: rope_write_kv_cache(q, k, v, positions, cos_sin,  # noqa: E731
                                           kv_cache, meta.slot_mapping)
        ab("rope_write_kv_cache, 128 tokens", rope, rope, env_a="0")
h = torch.randn(1, 4096, device=dev, dtype=dt)
res = torch.randn(1, 4096, device=dev, dtype=dt)
w = torch.ones(4096, device=dev, dtype=dt)
norm = lambda: add_rms_norm(h, res, w, 1e-5)  # noqa: E731
ab("add_rms_norm (loom's kernel), 1 row", norm, norm, env_a="0")
