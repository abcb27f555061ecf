"""The fused rotary + KV-cache-write kernel against the unfused torch path it replaces:
`RotaryEmbedding` on q and k, then the reference backend's cache write.

On the CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1), where its float32
arithmetic is torch's operation for operation: float32 results must be bitwise equal.
bfloat16 ones may be one ulp off there (the interpreter truncates float32 -> bfloat16 where
torch and the GPU round to nearest), and so may anything compiled on CUDA (the compiler may
contract a product and a sum into one FMA; `-m gpu`).
"""

import os
import zlib

import torch

# The interpreter must be chosen before triton is imported (see test_paged_attention.py).
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest  # noqa: E402

triton = pytest.importorskip("triton")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from loom.attention.torch_native import TorchNativeBackend  # noqa: E402
from loom.attention.triton_backend import TritonBackend  # noqa: E402
from loom.kernels.rope_kv_write import _rope_kv_write_kernel, rope_write_kv_cache  # noqa: E402
from loom.layers.norm import QKNorm  # noqa: E402
from loom.layers.rotary import RotaryEmbedding  # noqa: E402

INTERPRET = isinstance(_rope_kv_write_kernel, InterpretedFunction)
cpu_only = pytest.mark.skipif(not INTERPRET, reason="CPU checks need TRITON_INTERPRET=1")
needs_gpu = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(),
                               reason="needs CUDA and compiled Triton")

MAX_POS = 512
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def make_step(num_tokens, heads, kv_heads, head_dim, dtype, device="cpu", block_size=4):
    """q/k/v as strided views of one fused QKV tensor; distinct slots at random places with
    some -1 (padding) rows; a random cache whose slots to be written hold NaN."""
    qkv = torch.randn(num_tokens, (heads + 2 * kv_heads) * head_dim, device=device).to(dtype)
    q = qkv[:, :heads * head_dim].view(num_tokens, heads, head_dim)
    k = qkv[:, heads * head_dim:(heads + kv_heads) * head_dim].view(num_tokens, kv_heads,
                                                                       head_dim)
    v = qkv[:, (heads + kv_heads) * head_dim:].view(num_tokens, kv_heads, head_dim)
    num_blocks = 2 * num_tokens + 2
    slots = torch.randperm(num_blocks * block_size)[:num_tokens]
    slots[torch.rand(num_tokens) < 0.3] = -1
    if num_tokens > 1:
        slots[-1] = -1  # padding rows trail a batch
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim, device=device).to(dtype)
    written = slots[slots >= 0]
    cache.view(2, -1, kv_heads, head_dim)[:, written.to(device)] = float("nan")
    positions = torch.randint(0, MAX_POS, (num_tokens,), device=device)
    return q, k, v, positions, cache, slots.to(device)


def reference(rope, q, k, v, positions, cache, slots, qk_norm=None):
    """The unfused path: (normalise and) rotate in torch, then the torch backend's cache
    write."""
    if qk_norm is not None:
        q, k = qk_norm.apply(q, k)
    q_rot, k_rot = rope(positions, q, k)
    ref_cache = cache.clone()
    TorchNativeBackend().write_kv(k_rot, v, ref_cache, slots)
    return q_rot, ref_cache, k_rot


def assert_match(actual, expected, exact, ulps=1):
    """Equal (NaN included: a slot left unwritten would still hold its poison), bitwise or
    to about `ulps` ulps; an FMA on CUDA may shift a cancelling difference by an ulp of its
    O(1) products, hence the absolute term."""
    assert actual.isnan().equal(expected.isnan())
    actual, expected = actual.nan_to_num(7.0), expected.nan_to_num(7.0)
    if exact:
        assert torch.equal(actual, expected), \
            f"max diff {(actual.float() - expected.float()).abs().max()}"
    else:
        eps = torch.finfo(actual.dtype).eps
        torch.testing.assert_close(actual, expected, atol=4 * ulps * eps, rtol=ulps * eps)


def random_qk_norm(head_dim, dtype, device="cpu") -> QKNorm:
    """Weights around 1 (as trained ones are), none equal, and a non-default eps."""
    q_w, k_w = (1 + 0.5 * torch.randn(head_dim, device=device)).to(dtype), \
        (1 + 0.5 * torch.randn(head_dim, device=device)).to(dtype)
    return QKNorm(q_w, k_w, 1e-5)


def check(num_tokens, heads, kv_heads, head_dim, dtype, heads_per_program=None,
          device="cpu", with_kv_out=False, norm=False):
    rope = RotaryEmbedding(head_dim, MAX_POS, 500000.0, LLAMA3).to(device)
    q, k, v, positions, cache, slots = make_step(num_tokens, heads, kv_heads, head_dim,
                                                 dtype, device)
    qk_norm = random_qk_norm(head_dim, dtype, device) if norm else None
    q_ref, cache_ref, k_ref = reference(rope, q, k, v, positions, cache, slots, qk_norm)
    out = torch.full(q.shape, float("nan"), dtype=dtype, device=device)
    kv_out = torch.full((2,) + tuple(k.shape), float("nan"), dtype=dtype, device=device) \
        if with_kv_out else None
    got = rope_write_kv_cache(q, k, v, positions, rope.cos_sin_cache, cache, slots, out=out,
                              heads_per_program=heads_per_program, kv_out=kv_out,
                              qk_norm=qk_norm)
    assert got is out
    # The norm sums its squares in another order than torch, so its rstd may differ by an
    # ulp; each of its two roundings may then land an ulp apart, and the rotation adds two
    # such values.
    exact = INTERPRET and dtype == torch.float32 and not norm
    ulps = 4 if norm else 1
    assert_match(out, q_ref, exact, ulps)
    # The whole cache: rotated keys and values where written, untouched slots as they were.
    assert_match(cache, cache_ref, exact, ulps)
    if with_kv_out:  # the batch's rotated keys and values, rows with a slot; others untouched
        kept = slots >= 0
        expected = torch.stack([k_ref, v]).clone()
        expected[:, ~kept] = float("nan")
        assert_match(kv_out, expected, exact, ulps)


HEADS = {  # (heads, kv_heads, heads_per_program)
    "gqa2": (4, 2, None),
    "mha": (4, 4, None),
    "gqa3-split": (6, 2, 4),  # two query programs (the second half empty), a part-full key one
    "one-head-per-program": (4, 2, 1),
}


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("heads", HEADS.values(), ids=HEADS.keys())
def test_matches_rotary_then_cache_write(heads, head_dim, dtype):
    h, hkv, per_program = heads
    for num_tokens in (1, 3, 5):  # fresh inputs for each
        check(num_tokens, h, hkv, head_dim, dtype, per_program, with_kv_out=num_tokens != 3)


@cpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_dim", [24, 64])  # 24: halves of 12 in 16-wide blocks
@pytest.mark.parametrize("heads", [HEADS["gqa2"], HEADS["gqa3-split"]], ids=["gqa2", "gqa3-split"])
def test_normalises_each_head_before_rotating(heads, head_dim, dtype):
    """Qwen3's q_norm / k_norm in the kernel: as QKNorm.apply (torch's rms_norm per head)
    and then the rotation."""
    h, hkv, per_program = heads
    for num_tokens in (1, 5):
        check(num_tokens, h, hkv, head_dim, dtype, per_program, with_kv_out=num_tokens > 1,
              norm=True)


@cpu_only
def test_rejects_a_norm_weight_of_the_wrong_shape_or_dtype():
    rope = RotaryEmbedding(16, MAX_POS, 10000.0)
    q, k, v, positions, cache, slots = make_step(2, 4, 2, 16, torch.float32)
    good = torch.ones(16)
    for bad in (torch.ones(8), torch.ones(16, dtype=torch.bfloat16)):
        with pytest.raises(ValueError, match="k norm weight"):
            rope_write_kv_cache(q, k, v, positions, rope.cos_sin_cache, cache, slots,
                                qk_norm=QKNorm(good, bad, 1e-6))


@cpu_only
@pytest.mark.parametrize("norm", [False, True], ids=["", "qk-norm"])
def test_backends_rope_write_kv_agree(norm):
    """TritonBackend's fused rope_write_kv and the base class's torch fallback (what the
    attention op runs on other backends) store and return the same."""
    rope = RotaryEmbedding(64, MAX_POS, 10000.0)
    q, k, v, positions, cache, slots = make_step(5, 8, 2, 64, torch.bfloat16)
    assert (slots < 0).any() and (slots >= 0).any()
    qk_norm = random_qk_norm(64, torch.bfloat16) if norm else None
    fallback_cache = cache.clone()
    fused_q = TritonBackend().rope_write_kv(q, k, v, positions, rope.cos_sin_cache, cache, slots,
                                            qk_norm=qk_norm)
    torch_q = TorchNativeBackend().rope_write_kv(q, k, v, positions, rope.cos_sin_cache,
                                                 fallback_cache, slots, qk_norm=qk_norm)
    assert_match(fused_q, torch_q, exact=False, ulps=4 if norm else 1)
    assert_match(cache, fallback_cache, exact=False, ulps=4 if norm else 1)


@cpu_only
def test_rejects_an_odd_head_dim_and_a_non_power_of_two_split():
    rope = RotaryEmbedding(16, MAX_POS, 10000.0)
    q, k, v, positions, cache, slots = make_step(2, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="power of two"):
        rope_write_kv_cache(q, k, v, positions, rope.cos_sin_cache, cache, slots,
                            heads_per_program=3)
    with pytest.raises(ValueError, match="even head dim"):
        rope_write_kv_cache(q[..., :15], k[..., :15], v[..., :15], positions,
                            rope.cos_sin_cache, cache, slots)


# ---- CUDA, compiled: Llama-3-8B / 70B-per-TP-rank head counts -------------------------
@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("heads", [(32, 8), (8, 1), (64, 8)], ids=["8b", "70b-tp8", "70b"])
@pytest.mark.parametrize("num_tokens", [1, 7, 300])
@pytest.mark.parametrize("norm", [False, True], ids=["", "qk-norm"])
def test_gpu_within_one_ulp(num_tokens, heads, dtype, norm):
    check(num_tokens, *heads, 128, dtype, device="cuda", with_kv_out=num_tokens > 1,
          norm=norm)
