"""The attention layer: one opaque custom op over the paged KV cache.

`loom::attention` is the op that level-3 compilation splits the graph at; it reads the
batch's metadata and this layer's cache from the forward context. Given positions and the
rotary table it also rotates the query and key, so that a backend can fuse the rotation
into its cache write (one op name either way, so graph splitting treats both alike); given
q/k norm weights too, it normalises each head before rotating it. A layer's sliding window
and score softcap are arguments too: constants of the layer, which compiled graphs and CUDA
graphs bake in.
"""

from __future__ import annotations

import torch
from torch import nn

from loom.attention.backend import ScoreOpts
from loom.forward_context import get_forward_context
from loom.layers.norm import QKNorm
from loom.library import loom_op


@loom_op("attention",
         "(Tensor query, Tensor key, Tensor value, int layer_idx, float scale, "
         "Tensor? positions=None, Tensor? cos_sin_cache=None, Tensor? q_norm=None, "
         "Tensor? k_norm=None, float norm_eps=0.0, int sliding_window=0, "
         "float softcap=0.0) -> Tensor")
def attention_op(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 layer_idx: int, scale: float, positions: torch.Tensor | None = None,
                 cos_sin_cache: torch.Tensor | None = None, q_norm: torch.Tensor | None = None,
                 k_norm: torch.Tensor | None = None, norm_eps: float = 0.0,
                 sliding_window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """query [T, Hq*D], key/value [T, Hkv*D] -> [T, Hq*D]; writes key/value to the cache.
    With positions (and cos_sin_cache), query and key come unrotated and are rotated here;
    with q_norm and k_norm ([D] weights) too, unnormalised, and each head is RMS-normalised
    (eps norm_eps) before its rotation. sliding_window and softcap: `ScoreOpts`' (0: none)."""
    qk_norm = None
    if q_norm is not None or k_norm is not None:
        if q_norm is None or k_norm is None or positions is None:
            raise ValueError("attention: q_norm and k_norm come together, with positions")
        qk_norm = QKNorm(q_norm, k_norm, norm_eps)
    ctx = get_forward_context()
    if ctx.layer_clock is not None:
        ctx.layer_clock.mark()
    meta = ctx.attn_metadata
    head_dim = ctx.kv_caches[layer_idx].shape[-1] if ctx.kv_caches else 1
    q = query.view(query.shape[0], -1, head_dim)
    if meta is None:
        return torch.zeros_like(query)
    kv_cache = ctx.kv_caches[layer_idx]
    shape = (key.shape[0], -1, head_dim)
    k, v = key.view(shape), value.view(shape)
    opts = ScoreOpts(sliding_window or None, softcap or None)
    own_kv = ctx.backend.attends_batch_kv(meta, kv_cache, k, opts)
    if positions is None:
        ctx.backend.write_kv(k, v, kv_cache, meta.slot_mapping)
        batch_kv = (k, v) if own_kv else None
    else:
        if meta.is_pure_decode:
            out = ctx.backend.decode_rope(q, k, v, positions, cos_sin_cache, kv_cache, meta,
                                          scale, qk_norm, opts)
            if out is not None:
                return out.reshape(query.shape)
        kv_out = k.new_empty((2,) + tuple(k.shape)) if own_kv else None
        q = ctx.backend.rope_write_kv(q, k, v, positions, cos_sin_cache, kv_cache,
                                      meta.slot_mapping, kv_out=kv_out, qk_norm=qk_norm)
        batch_kv = tuple(kv_out) if own_kv else None
    return ctx.backend.forward(q, kv_cache, meta, scale, batch_kv, opts).reshape(query.shape)


@attention_op.register_fake
def _(query, key, value, layer_idx, scale, positions=None, cos_sin_cache=None, q_norm=None,
      k_norm=None, norm_eps=0.0, sliding_window=0, softcap=0.0):
    return torch.empty_like(query)


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_dim: int, num_kv_heads: int, layer_idx: int,
                 scale: float | None = None, sliding_window: int | None = None,
                 softcap: float | None = None) -> None:
        """sliding_window, softcap: `ScoreOpts`' (the model's, for this layer)."""
        super().__init__()
        self.num_heads, self.head_dim, self.num_kv_heads = num_heads, head_dim, num_kv_heads
        self.layer_idx = layer_idx
        self.scale = scale if scale is not None else head_dim ** -0.5
        self.opts = ScoreOpts(sliding_window, softcap)
        self.fused_rope = False
        """Whether the model hands q and k over unrotated, with positions and the rotary
        table (set by `set_fused_rope` before the model is traced: the graph bakes it in)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                positions: torch.Tensor | None = None,
                cos_sin_cache: torch.Tensor | None = None,
                qk_norm: QKNorm | None = None) -> torch.Tensor:
        # Eager, the Python implementation itself: the dispatcher's boxing of ten arguments
        # cost ~39 us a layer (`loom.library`). Traced, the op, which graphs split at.
        op = torch.ops.loom.attention if torch.compiler.is_compiling() else attention_op
        window, softcap = self.opts
        return op(q, k, v, self.layer_idx, self.scale, positions, cos_sin_cache,
                  *(qk_norm or (None, None, 0.0)), window or 0, softcap or 0.0)


def set_fused_rope(model: nn.Module, enabled: bool) -> None:
    """Let (or stop) the attention op rotate q and k in every attention layer of model: on
    when the backend fuses rotary into its cache-write kernel (`AttentionBackend.fuses_rope`),
    which saves a launch per layer. Call it before compiling the model."""
    for module in model.modules():
        if isinstance(module, Attention):
            module.fused_rope = enabled
