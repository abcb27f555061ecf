"""Where an eagerly called attention op spends its host time at decode (Llama-3.1-8B
shapes, batch 1, a 160-token context, bf16): cProfile over N calls, the functions with the
most time of their own. host_ab.py measured the op at ~140 us a call against ~57 us for the
decode kernel's own launch (run_zzz70)."""

import cProfile
import pstats

import torch

from loom.attention.triton_backend import TritonBackend
from loom.bench.attention_workload import AttentionShape, Step, make_inputs
from loom.forward_context import ForwardContext, forward_context
from loom.layers.attention import attention_op
from loom.layers.rotary import RotaryEmbedding

dev, dt, N = torch.device("cuda"), torch.bfloat16, 2000
H, HKV, D = 32, 8, 128
cos_sin = RotaryEmbedding(D, 8192, 500000.0).to(dev).cos_sin_cache
inputs = make_inputs(Step((1,), (160,)), AttentionShape(H, HKV, D), 16, dt, dev, seed=0)
qkv = torch.randn(1, (H + 2 * HKV) * D, device=dev, dtype=dt)
q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=1)
positions = torch.tensor([159], device=dev)
with forward_context(ForwardContext(inputs.meta, [inputs.kv_cache], TritonBackend())):
    call = lambda: attention_op(q, k, v, 0, D ** -0.5, positions, cos_sin)  # noqa: E731
    for _ in range(50):
        call()
    torch.cuda.synchronize()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(N):
        call()
    profile.disable()
    torch.cuda.synchronize()
stats = pstats.Stats(profile).sort_stats("tottime")
print(f"{N} calls; per call, us (own time):")
for (file, line, name), (cc, nc, tt, ct, _) in sorted(stats.stats.items(),
                                                     key=lambda kv: -kv[1][2])[:25]:
    print(f"{tt / N * 1e6:8.2f} own {ct / N * 1e6:8.2f} cum {nc / N:6.1f}/call  "
          f"{file.split('/')[-1]}:{line} {name}")
