"""Gemma, Gemma 2 and Gemma 3 (text only: Gemma3ForCausalLM, the 1B model or a text
checkpoint): Llama's projections with Gemma's own parts.

- RMSNorms whose weights are offsets from one (`GemmaRMSNorm`); Gemma 2 and 3 have four a
  layer, after attention and around the MLP as well as before attention; Gemma (1) has
  Llama's two, before attention and before the MLP.
- Embeddings scaled by sqrt(hidden_size), rounded to the model's dtype first as
  transformers does; the LM head tied to them.
- A gated MLP with tanh-approximated GELU; the softmax scale from query_pre_attn_scalar.
- Local layers attending within a sliding window, alternating with global ones
  (`ModelArch.sliding_layers`); Gemma 3's local layers rotate at their own base.
- Gemma 2: attention scores and final logits softcapped (tanh(x / cap) * cap).
- Gemma 3: per-head q/k norms (Gemma's form) before the rotation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from loom.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from loom.layers.norm import GemmaRMSNorm
from loom.layers.rotary import RotaryEmbedding
from loom.models.arch import ModelArch
from loom.models.llama import MLP, SelfAttention, make_rotary
from loom.models.weights import load_named_weights

logger = logging.getLogger(__name__)


class GeluMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)


class GemmaAttention(SelfAttention):
    """Llama's attention (window, scale and softcap come from the arch) with Gemma 3's q/k
    norms applied here in torch: the backends' fused q/k norm is Llama's, weight times the
    normalised head, not (1 + weight) rounded after the product."""

    def __init__(self, arch: ModelArch, layer_idx: int, rotary_emb: RotaryEmbedding,
                 qk_norm: bool) -> None:
        super().__init__(arch, layer_idx, rotary_emb, qkv_bias=arch.attention_bias,
                         o_bias=arch.attention_bias, qk_norm=False)
        self.q_norm = GemmaRMSNorm(self.head_dim, arch.rms_norm_eps) if qk_norm else None
        self.k_norm = GemmaRMSNorm(self.head_dim, arch.rms_norm_eps) if qk_norm else None

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        if self.q_norm is None:
            return super().forward(positions, x)
        qkv = self.qkv_proj(x)
        n, d, q_end = qkv.shape[0], self.head_dim, self.q_size
        q = self.q_norm(qkv[:, :q_end].reshape(n, -1, d))
        k = self.k_norm(qkv[:, q_end:q_end + self.kv_size].reshape(n, -1, d))
        v = qkv[:, q_end + self.kv_size:]
        if self.attn.fused_rope:  # the backend rotates them in its cache-write kernel
            return self.o_proj(self.attn(q.flatten(1), k.flatten(1), v, positions,
                                         self.rotary_emb.cos_sin_cache))
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q.flatten(1), k.flatten(1), v))


class GemmaDecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, layer_idx: int, rotary_emb: RotaryEmbedding,
                 qk_norm: bool) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(arch, layer_idx, rotary_emb, qk_norm)
        self.mlp = GeluMLP(arch.hidden_size, arch.intermediate_size)
        h, eps = arch.hidden_size, arch.rms_norm_eps
        self.input_layernorm = GemmaRMSNorm(h, eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps)

    def forward(self, positions, hidden, residual):
        """As Llama's layers, the residual stream is carried beside the output: the input
        is hidden + residual (just hidden in the first layer)."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class Gemma1DecoderLayer(nn.Module):
    """Gemma (1): Llama's pre-norm layer with Gemma's norms and GELU MLP."""

    def __init__(self, arch: ModelArch, layer_idx: int, rotary_emb: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = GemmaAttention(arch, layer_idx, rotary_emb, qk_norm=False)
        self.mlp = GeluMLP(arch.hidden_size, arch.intermediate_size)
        self.input_layernorm = GemmaRMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, positions, hidden, residual):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class GemmaModel(nn.Module):
    def __init__(self, arch: ModelArch, layers: list[nn.Module]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = GemmaRMSNorm(arch.hidden_size, arch.rms_norm_eps)
        # in the model's dtype, as transformers multiplies: sqrt(3584) is 60.0 in bf16
        self.register_buffer("normalizer", torch.tensor(
            arch.hidden_size ** 0.5, dtype=self.embed_tokens.weight.dtype), persistent=False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids) * self.normalizer, None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Gemma2ForCausalLM(nn.Module):
    qk_norm = False

    def __init__(self, arch: ModelArch, max_model_len: int | None = None) -> None:
        super().__init__()
        if arch.hidden_act != "gelu_pytorch_tanh":
            raise ValueError(f"{arch.architecture}: hidden_activation {arch.hidden_act!r} is "
                             "not supported (gelu_pytorch_tanh)")
        self.arch = arch
        self.rotary_emb = make_rotary(arch, max_model_len or arch.context_len)
        self.local_rotary_emb = None if arch.local_rope_theta is None else RotaryEmbedding(
            arch.head_dim, arch.max_position_embeddings, arch.local_rope_theta)
        self.model = GemmaModel(arch, [self.make_layer(arch, i) for i in range(arch.num_layers)])
        self.lm_head = ParallelLMHead(arch.vocab_size, arch.hidden_size)
        if arch.tie_word_embeddings:
            self.lm_head.tie_weights(self.model.embed_tokens)
        logger.info("%s: Gemma's norms run as torch ops, so sequence parallelism and the "
                    "all-reduce + norm fusion do not apply to them", arch.architecture)

    def make_layer(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        local = arch.window(layer_idx) is not None and self.local_rotary_emb is not None
        rotary = self.local_rotary_emb if local else self.rotary_emb
        return GemmaDecoderLayer(arch, layer_idx, rotary, self.qk_norm)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head.compute_logits(hidden)
        cap = self.arch.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_named_weights(self, weights)


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    qk_norm = True


class GemmaForCausalLM(Gemma2ForCausalLM):
    """Gemma (1): no windows, softcaps or query_pre_attn_scalar; two norms a layer."""

    def make_layer(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        return Gemma1DecoderLayer(arch, layer_idx, self.rotary_emb)
