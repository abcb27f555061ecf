"""Causal GQA attention of one fresh prompt through PyTorch's SDPA (cuDNN's flash attention),
which the Triton backend takes for pure prefills of few requests (`TritonBackend._use_sdpa`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loom.kernels.host import round_up

SDPA_BUCKET = 512
"""SDPA runs each request at its length rounded up to a multiple of this. cuDNN builds an
execution graph per new shape: 42-65 ms (run_zzt, H200), paid by the first step of every new
prompt length. Rounded, the lengths are few enough to build them all at start-up
(warm_up_sdpa). Exact: the padding keys come after every real query, so causality masks
them, and the padding queries' rows are dropped."""


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scale: float) -> torch.Tensor:
    """Causal GQA attention of one request through SDPA: q [L, H, D], k and v [L, H_kv, D]
    (any strides and dtype; cast to q's) -> [L, H, D]. Copied into zero-padded contiguous
    buffers of SDPA_BUCKET-rounded length: one layout and few shapes for cuDNN's graphs."""
    n = q.shape[0]
    padded = round_up(n, SDPA_BUCKET)
    bufs = []
    for t in (q, k, v):
        buf = torch.empty(padded, *t.shape[1:], dtype=q.dtype, device=q.device)
        buf[:n] = t
        buf[n:].zero_()
        # 4-D [1, heads, seq, dim]: the flash kernels take only batched inputs; 3-D falls
        # back to the math kernel, which materialises the whole score matrix.
        bufs.append(buf.transpose(0, 1)[None])
    out = F.scaled_dot_product_attention(*bufs, is_causal=True, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)[:n]
