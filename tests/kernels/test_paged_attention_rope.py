"""The decode kernel rotating (and, for Qwen3, normalising) q and k and caching the new
tokens itself (`paged_decode(new_tokens=...)`), against rope_write_kv_cache followed by
paged_decode and against the torch backend; the helpers and cases are
test_paged_attention.py's. The interpreter on the CPU, compiled bf16 on CUDA (`-m gpu`)."""

from dataclasses import dataclass

import pytest
import torch

# First: it picks the interpreter (TRITON_INTERPRET) before anything imports Triton.
from tests.kernels.test_paged_attention import (  # noqa: F401  (_seed: the autouse fixture)
    DECODE, GPU_CASES, Batch, _seed, cpu_only, make_batch, needs_gpu, reference)

from loom.attention.triton_backend import TritonBackend
from loom.kernels.paged_decode import paged_decode

QK_NORM_CASES = ["gqa8-d64-b16", "gqa1-d128-b32"]  # padding rows in one, a group of 1


@dataclass
class FusedAndUnfused:
    fused: torch.Tensor
    """paged_decode's output rotating and storing the new tokens itself (batch.kv_cache)."""
    unfused: torch.Tensor
    """rope_write_kv_cache then paged_decode, on a copy of the cache (unfused_cache)."""
    unfused_cache: torch.Tensor
    q_rot: torch.Tensor
    positions: torch.Tensor
    cos_sin: torch.Tensor


def decode_fused_and_unfused(batch: Batch, splits: int, block_n: int,
                             qk_norm=None) -> FusedAndUnfused:
    """A pure decode both ways, into NaN-poisoned outputs; qk_norm: a `QKNorm` both apply."""
    from loom.kernels.paged_decode import NewTokens
    from loom.kernels.rope_kv_write import rope_write_kv_cache
    from loom.layers.rotary import RotaryEmbedding
    m, scale = batch.meta, batch.query.shape[-1] ** -0.5
    device = batch.query.device
    # The table must cover every position: the GPU cases reach 9000 tokens.
    max_pos = int(m.seq_lens.max())
    cos_sin = RotaryEmbedding(batch.query.shape[-1], max_pos, 10000.0).cos_sin_cache.to(device)
    # Positions as the runner gives them: each decode at its request's last position.
    pad = batch.query.shape[0] - m.num_actual_tokens
    positions = torch.cat([m.seq_lens.long() - 1, torch.zeros(pad, dtype=torch.long,
                                                              device=device)])
    unfused_cache = batch.kv_cache.clone()
    q_rot = rope_write_kv_cache(batch.query, batch.key, batch.value, positions, cos_sin,
                                unfused_cache, m.slot_mapping, qk_norm=qk_norm)
    unfused = torch.full_like(batch.query, float("nan"))
    paged_decode(q_rot, unfused_cache, unfused, m.block_table, m.query_start_loc, m.seq_lens,
                 m.num_reqs, scale, splits, block_n)
    fused = torch.full_like(batch.query, float("nan"))
    paged_decode(batch.query, batch.kv_cache, fused, m.block_table, m.query_start_loc,
                 m.seq_lens, m.num_reqs, scale, splits, block_n,
                 new_tokens=NewTokens(batch.key, batch.value, positions, cos_sin,
                                      m.slot_mapping, qk_norm))
    return FusedAndUnfused(fused, unfused, unfused_cache, q_rot, positions, cos_sin)


def check_decode_with_new_tokens(batch: Batch, splits: int, block_n: int, atol, rtol,
                                 norm: bool = False) -> None:
    """new_tokens: the decode kernel rotates q and k (norm: normalising each head first,
    with random weights) and stores k and v as rope_write_kv_cache does, so the cache comes
    out identical and the output the same as that kernel followed by paged_decode, and close
    to the torch backend's."""
    from loom.layers.norm import QKNorm
    m, scale = batch.meta, batch.query.shape[-1] ** -0.5
    device = batch.query.device
    d = batch.query.shape[-1]
    qk_norm = QKNorm(*((1 + 0.5 * torch.randn(d, device=device)).to(batch.query.dtype)
                       for _ in range(2)), 1e-5) if norm else None
    r = decode_fused_and_unfused(batch, splits, block_n, qk_norm)
    fused, unfused, unfused_cache = r.fused, r.unfused, r.unfused_cache
    if device.type == "cpu" and not norm:
        assert torch.equal(batch.kv_cache.nan_to_num(7.0), unfused_cache.nan_to_num(7.0))
    else:  # the GPU compiler may contract the rotation's products into FMAs either way;
        # the norms sum their squares in different orders (rstd an ulp apart)
        torch.testing.assert_close(batch.kv_cache, unfused_cache, atol=atol, rtol=rtol,
                                   equal_nan=True)
    n = m.num_actual_tokens
    torch.testing.assert_close(fused[:n], unfused[:n], atol=atol, rtol=rtol)
    # Against the torch backend too, on the rotated inputs: nobody here wrote that one.
    _, ref = reference(Batch(r.q_rot, *_rotated_kv(batch, r.positions, r.cos_sin, qk_norm),
                             unfused_cache, m), scale)
    torch.testing.assert_close(fused[:n].float(), ref[:n], atol=10 * atol, rtol=10 * rtol)


@cpu_only
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("case", DECODE.values(), ids=DECODE.keys())
def test_decode_rotates_and_caches_the_new_tokens_itself(case, splits):
    check_decode_with_new_tokens(make_batch(*case[:6], pad=case[6]), splits, 16, 1e-5, 1e-5)


@cpu_only
@pytest.mark.parametrize("case", [DECODE[k] for k in QK_NORM_CASES], ids=QK_NORM_CASES)
def test_decode_normalises_q_and_k_before_rotating(case):
    """Qwen3's q/k norm inside the decode kernel, float32: as rope_write_kv_cache applies it
    and close to torch's norm, rotation and attention."""
    check_decode_with_new_tokens(make_batch(*case[:6], pad=case[6]), 3, 16, 1e-5, 1e-5,
                                 norm=True)


def _rotated_kv(batch: Batch, positions, cos_sin,
                qk_norm=None) -> tuple[torch.Tensor, torch.Tensor]:
    from loom.layers.rotary import rotate_at
    key = batch.key
    if qk_norm is not None:
        _, key = qk_norm.apply(batch.query, key)
    return rotate_at(positions, key, cos_sin), batch.value


def test_new_tokens_refuse_a_request_index():
    from loom.kernels.paged_decode import NewTokens
    batch = make_batch([1], [5], 2, 1, 16, 16)
    m = batch.meta
    with pytest.raises(ValueError, match="new_tokens with req_index"):
        paged_decode(batch.query, batch.kv_cache, batch.query.clone(), m.block_table,
                     m.query_start_loc, m.seq_lens, 1, 1.0, 1, 16,
                     req_index=torch.zeros(1, dtype=torch.int32),
                     new_tokens=NewTokens(batch.key, batch.value, torch.zeros(1).long(),
                                          torch.zeros(8, 16), m.slot_mapping))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("splits", [1, 7])
@pytest.mark.parametrize("case", [c for c in GPU_CASES.values() if max(c[0]) == 1],
                         ids=[k for k, c in GPU_CASES.items() if max(c[0]) == 1])
@pytest.mark.parametrize("norm", [False, True], ids=["", "qk-norm"])
def test_gpu_bf16_decode_with_new_tokens(case, splits, norm):
    q_lens, s_lens, h, hkv, d, bs, pad = case
    batch = make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad, dtype=torch.bfloat16,
                       device="cuda")
    check_decode_with_new_tokens(batch, splits, 64, 2e-2, 2e-2, norm)


@cpu_only
def test_decode_rope_unfused_falls_back_to_the_rotary_kernel(monkeypatch):
    monkeypatch.setenv("LOOM_DECODE_ROPE_UNFUSED", "1")
    assert TritonBackend().decode_rope(*[None] * 8) is None  # the caller rotates first
    monkeypatch.delenv("LOOM_DECODE_ROPE_UNFUSED")
    batch = make_batch([1], [5], 2, 1, 16, 16)
    from loom.layers.rotary import RotaryEmbedding
    out = TritonBackend().decode_rope(batch.query, batch.key, batch.value,
                                      batch.meta.seq_lens.long() - 1,
                                      RotaryEmbedding(16, 64, 10000.0).cos_sin_cache,
                                      batch.kv_cache, batch.meta, 0.25)
    assert out is not None and not out.isnan().any()
