"""The reference backend: plain PyTorch over the paged cache, one request at a time.

It runs anywhere (the CPU included) and is what the GPU backends are tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from loom.attention.backend import PLAIN, AttentionBackend, AttentionMetadata, ScoreOpts


class TorchNativeBackend(AttentionBackend):
    name = "torch_native"

    def write_kv(self, key, value, kv_cache, slot_mapping):
        num_tokens = key.shape[0]
        slots = slot_mapping[:num_tokens]
        valid = slots >= 0
        if not bool(valid.all()):
            slots, key, value = slots[valid], key[valid], value[valid]
        flat = kv_cache.view(2, -1, kv_cache.shape[-2], kv_cache.shape[-1])
        key, value = to_cache_dtype(key, kv_cache.dtype), to_cache_dtype(value, kv_cache.dtype)
        if kv_cache.element_size() == 1:  # index_copy_ has no 8-bit float kernels: copy bytes
            flat, key, value = (t.view(torch.uint8) for t in (flat, key, value))
        flat[0].index_copy_(0, slots, key)
        flat[1].index_copy_(0, slots, value)

    def forward(self, query, kv_cache, meta: AttentionMetadata, scale, batch_kv=None,
                opts: ScoreOpts = PLAIN):
        block_size = kv_cache.shape[2]
        out = torch.zeros_like(query)
        if meta.fixed_shape:  # a graph's bounds host-side: the batch is on the device
            starts, seq_lens = meta.query_start_loc.tolist(), meta.seq_lens.tolist()
        else:
            starts, seq_lens = meta.host_bounds
        for i in range(meta.num_reqs):
            q = query[starts[i]:starts[i + 1]]
            if q.shape[0] == 0:
                continue
            k, v = gather_kv(kv_cache, meta.block_table[i], seq_lens[i], block_size)
            out[starts[i]:starts[i + 1]] = attend(q, k, v, scale, opts)
        return out


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as a cache of `dtype` stores it: an 8-bit cache saturates at its largest value, as
    the Triton kernels' `to_cache` does."""
    if dtype.itemsize == 1:
        limit = torch.finfo(dtype).max
        x = x.float().clamp(-limit, limit)
    return x.to(dtype)


def gather_kv(kv_cache: torch.Tensor, block_row: torch.Tensor, seq_len: int,
              block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first seq_len keys and values of one request, [seq_len, kv_heads, head_dim]."""
    num_blocks = (seq_len + block_size - 1) // block_size
    # One gather for both planes, indexed by the int32 block ids as they are: on a GPU each
    # extra op here is a launch in every layer of an eagerly run prefill.
    kv = kv_cache[:, block_row[:num_blocks]].flatten(1, 2)[:, :seq_len]
    return kv[0], kv[1]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
           opts: ScoreOpts = PLAIN) -> torch.Tensor:
    """q [Q, H, D] are the last Q positions of k/v [S, Hkv, D]; causal, within opts'
    sliding window, scores softcapped where opts say so."""
    q_len, seq_len, dtype = q.shape[0], k.shape[0], q.dtype
    first = 0
    if opts.sliding_window is not None:  # keys before every query's window: not read
        first = max(0, seq_len - q_len + 1 - opts.sliding_window)
        k, v = k[first:], v[first:]
    if k.element_size() == 1:  # an 8-bit cache: attend in the query's dtype
        k, v = k.to(q.dtype), v.to(q.dtype)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
    k_pos = torch.arange(first, seq_len, device=q.device)[None, :]
    mask = q_pos >= k_pos
    if opts.sliding_window is not None:
        mask &= k_pos > q_pos - opts.sliding_window
    q, k, v = q.transpose(0, 1).to(v.dtype), k.transpose(0, 1), v.transpose(0, 1)
    if opts.softcap is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    else:  # SDPA has no softcap: the scores by hand, in float32
        out = capped_attention(q, k, v, mask, scale, opts.softcap)
    return out.transpose(0, 1).to(dtype)


def capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float, softcap: float) -> torch.Tensor:
    """Softmax attention of q [H, Q, D] over k/v [H, S, D] where mask [Q, S] allows, each
    score s (scaled) taken as tanh(s / softcap) * softcap first."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return torch.matmul(probs, v.float()).to(v.dtype)
