"""Llama-family decoders: Llama 2/3/3.1 (and SmolLM2), Mistral, Qwen2 (QKV bias), Qwen3
(q/k norm), SmolLM3 (NoPE layers); the MoE and Phi-3 models build on them.

Reads like single-device code: the parallel layers shard themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from loom.layers.attention import Attention
from loom.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from loom.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear,
                                QKVParallelLinear, RowParallelLinear)
from loom.layers.norm import QKNorm, RMSNorm
from loom.layers.rotary import RotaryEmbedding
from loom.models.arch import ModelArch
from loom.models.arch_rope import rope_kind
from loom.models.weights import load_named_weights

logger = logging.getLogger(__name__)


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int,
                 reduce_results: bool = True, bias: bool = False) -> None:
        """reduce_results=False: this rank's partial sum, for a caller that adds it to
        another before one all-reduce (Qwen2-MoE's shared expert)."""
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2,
                                                       bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias,
                                           reduce_results=reduce_results)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class UpDownMLP(nn.Module):
    """A non-gated MLP, down(act(up(x))): Arcee's, with ReLU squared."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str,
                 bias: bool = False) -> None:
        super().__init__()
        if act != "relu2":
            raise ValueError(f"hidden_act: {act!r} is not supported in a non-gated MLP (relu2)")
        self.up_proj = ColumnParallelLinear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.relu(self.up_proj(x)).square())


class SelfAttention(nn.Module):
    def __init__(self, arch: ModelArch, layer_idx: int, rotary_emb: RotaryEmbedding | None,
                 qkv_bias: bool, o_bias: bool, qk_norm: bool) -> None:
        """rotary_emb None: a NoPE layer (SmolLM3's), whose q and k are never rotated."""
        super().__init__()
        d = arch.head_dim
        self.qkv_proj = QKVParallelLinear(arch.hidden_size, d, arch.num_heads, arch.num_kv_heads,
                                          bias=qkv_bias)
        self.o_proj = RowParallelLinear(arch.num_heads * d, arch.hidden_size, bias=o_bias)
        self.q_size, self.kv_size = self.qkv_proj.q_size, self.qkv_proj.kv_size
        self.head_dim = d
        self.rotary_emb = rotary_emb
        self.attn = Attention(self.qkv_proj.num_heads, d, self.qkv_proj.num_kv_heads, layer_idx,
                              arch.attn_scale, arch.window(layer_idx),
                              arch.attn_logit_softcapping)
        self.q_norm = RMSNorm(d, arch.rms_norm_eps) if qk_norm else None
        self.k_norm = RMSNorm(d, arch.rms_norm_eps) if qk_norm else None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        n, d = qkv.shape[0], self.head_dim
        q, k = qkv[:, :self.q_size], qkv[:, self.q_size:self.q_size + self.kv_size]
        v = qkv[:, self.q_size + self.kv_size:]  # a strided view: the cache write reads it
        if self.rotary_emb is None:
            # NoPE: no positions for the attention op either, so that a backend that fuses
            # rotary into its cache write (fused_rope) only writes the cache, as here.
            if self.q_norm is not None:
                q = self.q_norm(q.reshape(n, -1, d)).flatten(1)
                k = self.k_norm(k.reshape(n, -1, d)).flatten(1)
            return self.o_proj(self.attn(q, k, v))
        if self.attn.fused_rope:
            # The attention backend rotates q and k (normalising them first) in its
            # cache-write kernel.
            qk_norm = None if self.q_norm is None else QKNorm(
                self.q_norm.weight, self.k_norm.weight, self.q_norm.eps)
            return self.o_proj(self.attn(q, k, v, positions, self.rotary_emb.cos_sin_cache,
                                         qk_norm))
        if self.q_norm is not None:
            q = self.q_norm(q.reshape(n, -1, d)).flatten(1)
            k = self.k_norm(k.reshape(n, -1, d)).flatten(1)
        if self.q_norm is None:
            # Query and key heads sit side by side in each row: one rotation for both.
            qk = self.rotary_emb.rotate(positions, qkv[:, :self.q_size + self.kv_size]
                                        .view(n, -1, d)).flatten(1)
            q, k = qk[:, :self.q_size], qk[:, self.q_size:]
        else:
            q, k = (t.flatten(1) for t in self.rotary_emb(positions, q.view(n, -1, d),
                                                           k.view(n, -1, d)))
        return self.o_proj(self.attn(q, k, v))


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, layer_idx: int, mlp: nn.Module, **attn_opts) -> None:
        super().__init__()
        self.self_attn = SelfAttention(arch, layer_idx, **attn_opts)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, positions, hidden, residual):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.branch_output(self.self_attn(positions, hidden))
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.branch_output(self.mlp(hidden)), residual

    def branch_output(self, out: torch.Tensor) -> torch.Tensor:
        """The attention's or MLP's output as it joins the residual stream (Granite scales
        it)."""
        return out


class DecoderModel(nn.Module):
    def __init__(self, arch: ModelArch, layers: list[DecoderLayer]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The first layer's input (Granite scales it)."""
        return self.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_input_ids(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


def make_rotary(arch: ModelArch, max_model_len: int) -> RotaryEmbedding:
    """One table of cos/sin shared by every layer (it is large at 128k positions).

    LongRoPE's two factor lists are for sequences within the pretraining length and beyond
    it; transformers switches a sequence to the long ones (recomputing its cache) once it
    grows past that length. A KV cache keeps keys rotated once, so loom takes one list for
    every sequence: the short one when max_model_len fits in the pretraining length (what
    transformers computes for all of them), else the long one (what it computes for the
    sequences beyond it). A partial_rotary_factor rotates that share of each head."""
    rotary_dim = int(arch.head_dim * arch.partial_rotary_factor)
    rope = arch.long_rope
    if rope is None:  # YaRN's context may pass max_position_embeddings (`context_len`)
        scaling = arch.rope_scaling or {}
        return RotaryEmbedding(arch.head_dim, max(arch.max_position_embeddings, max_model_len),
                               arch.rope_theta, arch.rope_scaling,
                               magnitude=scaling.get("attention_factor", 1.0)
                               if rope_kind(scaling) == "yarn" else 1.0, rotary_dim=rotary_dim)
    long = max_model_len > rope.original_max_position_embeddings
    if long:
        logger.info("rope_scaling: LongRoPE's long factors for every sequence, since "
                    "max_model_len (%d) exceeds original_max_position_embeddings (%d); "
                    "transformers uses the short ones for sequences within that length "
                    "(--max-model-len %d matches it there)", max_model_len,
                    rope.original_max_position_embeddings, rope.original_max_position_embeddings)
    return RotaryEmbedding(arch.head_dim, arch.max_position_embeddings, arch.rope_theta,
                           divisors=rope.long_factor if long else rope.short_factor,
                           magnitude=rope.attention_factor, rotary_dim=rotary_dim)


class LlamaForCausalLM(nn.Module):
    qkv_bias = False
    qk_norm = False
    model_cls = DecoderModel

    def __init__(self, arch: ModelArch, max_model_len: int | None = None) -> None:
        """max_model_len: the longest sequence the engine will run (None: the model's own
        context length); LongRoPE picks its factors by it."""
        super().__init__()
        self.arch = arch
        self.rotary_emb = make_rotary(arch, max_model_len or arch.context_len)
        layers = [self.make_layer(arch, i) for i in range(arch.num_layers)]
        self.model = self.model_cls(arch, layers)
        self.make_head(arch)

    def make_head(self, arch: ModelArch) -> None:
        self.lm_head = ParallelLMHead(arch.vocab_size, arch.hidden_size)
        if arch.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)

    def attn_opts(self) -> dict:
        o_bias = self.arch.attention_out_bias
        if o_bias is None:
            o_bias = self.arch.attention_bias and not self.qkv_bias
        return dict(rotary_emb=self.rotary_emb, qkv_bias=self.qkv_bias or self.arch.attention_bias,
                    o_bias=o_bias, qk_norm=self.qk_norm)

    def make_mlp(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        return MLP(arch.hidden_size, arch.intermediate_size, bias=arch.mlp_bias)

    def make_layer(self, arch: ModelArch, layer_idx: int) -> DecoderLayer:
        return DecoderLayer(arch, layer_idx, self.make_mlp(arch, layer_idx), **self.attn_opts())

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_named_weights(self, weights)


class Qwen2ForCausalLM(LlamaForCausalLM):
    qkv_bias = True


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True


class ArceeForCausalLM(LlamaForCausalLM):
    """Arcee (AFM-4.5B): Llama's, with a non-gated ReLU-squared MLP."""

    def make_mlp(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        return UpDownMLP(arch.hidden_size, arch.intermediate_size, arch.hidden_act,
                         bias=arch.mlp_bias)


class SmolLM3ForCausalLM(LlamaForCausalLM):
    """Llama's decoder whose layers `ModelArch.uses_rope` says no to (every 4th in
    SmolLM3-3B) attend without rotary embedding (NoPE), on every attention backend."""

    def make_layer(self, arch: ModelArch, layer_idx: int) -> DecoderLayer:
        opts = self.attn_opts()
        if not arch.uses_rope(layer_idx):
            opts["rotary_emb"] = None
        return DecoderLayer(arch, layer_idx, self.make_mlp(arch, layer_idx), **opts)
