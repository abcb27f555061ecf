"""OLMo 2 and 3 (Olmo2ForCausalLM, Olmo3ForCausalLM), and EXAONE 4.0 (Exaone4ForCausalLM:
the same layers with per-head q/k norms): Llama's projections, SiLU MLP and rotary
embedding, with

- norms after each branch instead of before it: x + norm(attn(x)), then x + norm(mlp(x));
- q and k each normalised over the whole projection (every head together, one weight
  element per feature), before the rotation;
- OLMo 3: three layers in four attend within a sliding window (layer_types), rotating at
  their own base, never scaled (the full layers' may be YaRN).

That q/k norm spans all heads, which tensor parallelism splits across ranks: TP=1 only
(`ModelArch.check_tensor_parallel` refuses more before any worker starts).
"""

from __future__ import annotations

import torch
from torch import nn

from loom.layers.norm import RMSNorm
from loom.layers.rotary import RotaryEmbedding
from loom.models.arch import ModelArch
from loom.models.llama import MLP, LlamaForCausalLM, SelfAttention


class Olmo2Attention(SelfAttention):
    def __init__(self, arch: ModelArch, layer_idx: int, rotary_emb: RotaryEmbedding) -> None:
        super().__init__(arch, layer_idx, rotary_emb, qkv_bias=arch.attention_bias,
                         o_bias=arch.attention_bias, qk_norm=False)
        self.q_norm = RMSNorm(self.q_size, arch.rms_norm_eps)
        self.k_norm = RMSNorm(self.kv_size, arch.rms_norm_eps)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(x)
        n, d = qkv.shape[0], self.head_dim
        q = self.q_norm(qkv[:, :self.q_size])
        k = self.k_norm(qkv[:, self.q_size:self.q_size + self.kv_size])
        v = qkv[:, self.q_size + self.kv_size:]
        if self.attn.fused_rope:  # the backend rotates them in its cache-write kernel
            return self.o_proj(self.attn(q, k, v, positions, self.rotary_emb.cos_sin_cache))
        q, k = self.rotary_emb(positions, q.view(n, -1, d), k.view(n, -1, d))
        return self.o_proj(self.attn(q.flatten(1), k.flatten(1), v))


class Olmo2DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, self_attn: nn.Module) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.mlp = MLP(arch.hidden_size, arch.intermediate_size)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_feedforward_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, positions, hidden, residual):
        """The residual stream carried beside the output, as Llama's layers carry it: the
        input is hidden + residual (just hidden in the first layer)."""
        x = hidden if residual is None else hidden + residual
        x = x + self.post_attention_layernorm(self.self_attn(positions, x))
        return self.post_feedforward_layernorm(self.mlp(x)), x


class Olmo2ForCausalLM(LlamaForCausalLM):
    def make_layer(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        return Olmo2DecoderLayer(arch, Olmo2Attention(arch, layer_idx, self.rotary_emb))


class Olmo3ForCausalLM(Olmo2ForCausalLM):
    def make_layer(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        rotary = self.rotary_emb
        if arch.window(layer_idx) is not None and arch.local_rope_theta is not None:
            if getattr(self, "local_rotary_emb", None) is None:
                self.local_rotary_emb = RotaryEmbedding(
                    arch.head_dim, arch.max_position_embeddings, arch.local_rope_theta)
            rotary = self.local_rotary_emb
        return Olmo2DecoderLayer(arch, Olmo2Attention(arch, layer_idx, rotary))


class Exaone4ForCausalLM(LlamaForCausalLM):
    """EXAONE 4.0: OLMo 2's post-branch norms with Qwen3's per-head q/k norms; under a
    sliding window, the windowed layers rotate and the global ones do not (NoPE)."""

    def make_layer(self, arch: ModelArch, layer_idx: int) -> nn.Module:
        nope = arch.sliding_window is not None and arch.window(layer_idx) is None
        attn = SelfAttention(arch, layer_idx, None if nope else self.rotary_emb,
                             qkv_bias=False, o_bias=False, qk_norm=True)
        return Olmo2DecoderLayer(arch, attn)
