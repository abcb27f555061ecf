"""The Triton paged-attention backend against the torch reference, on random batches.

On the CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1) with tiny shapes
that still span several cache blocks, key tiles and decode splits; with CUDA the same
checks run compiled in bf16 on larger shapes (`-m gpu`).
"""

import os
import zlib

import torch

# The interpreter must be chosen before triton is imported; a CUDA host defaults to
# compiled kernels so its bf16 checks test what production runs.
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402

triton = pytest.importorskip("triton")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from loom.attention.backend import AttentionMetadata  # noqa: E402
from loom.attention.torch_native import TorchNativeBackend  # noqa: E402
from loom.attention.triton_backend import TritonBackend, TritonTiles  # noqa: E402
from loom.kernels.kv_write import write_kv_cache  # noqa: E402
from loom.kernels.paged_attention import paged_prefill  # noqa: E402
from loom.kernels.paged_decode import _decode_split_kernel, paged_decode  # noqa: E402
from tests.triton_interpreter import patch_interpreter  # noqa: E402

# What the kernels were actually built as: another module may have imported them first.
INTERPRET = isinstance(_decode_split_kernel, InterpretedFunction)


if INTERPRET:
    patch_interpreter()

cpu_only = pytest.mark.skipif(not INTERPRET, reason="CPU checks need TRITON_INTERPRET=1")
needs_gpu = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(),
                               reason="needs CUDA and compiled Triton")


@pytest.fixture(autouse=True)
def _seed(request):
    """Reproducible per test; each make_batch inside a test still draws fresh inputs."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@dataclass
class Batch:
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    kv_cache: torch.Tensor
    meta: AttentionMetadata


def make_batch(query_lens, seq_lens, heads, kv_heads, head_dim, block_size, *, pad=0,
               dtype=torch.float32, device="cpu") -> Batch:
    """Requests whose first seq_len - query_len tokens are already cached (earlier chunks
    or prefix hits) in randomly placed blocks; the new tokens' slots hold NaN until written."""
    blocks_per_req = [triton.cdiv(s, block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + 3  # spare blocks stay random: reading one shows
    perm = torch.randperm(num_blocks)
    table = torch.zeros(len(seq_lens), max(blocks_per_req), dtype=torch.int32)
    cache = torch.randn(2, num_blocks, block_size, kv_heads, head_dim)
    slots, used = [], 0
    for i, (q_len, s_len) in enumerate(zip(query_lens, seq_lens)):
        table[i, :blocks_per_req[i]] = perm[used:used + blocks_per_req[i]]
        used += blocks_per_req[i]
        for pos in range(s_len - q_len, s_len):
            slot = int(table[i, pos // block_size]) * block_size + pos % block_size
            slots.append(slot)
            cache.view(2, -1, kv_heads, head_dim)[:, slot] = float("nan")
    num_tokens = len(slots) + pad
    starts = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    slot_mapping = torch.tensor(slots + [-1] * pad, dtype=torch.int64)
    qkv = torch.randn(num_tokens, heads + 2 * kv_heads, head_dim)
    qkv = qkv.to(device=device, dtype=dtype)
    meta = AttentionMetadata(
        num_actual_tokens=len(slots), num_reqs=len(seq_lens), max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), query_start_loc=starts.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_table=table.to(device), slot_mapping=slot_mapping.to(device),
        query_start_loc_cpu=starts, seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int32))
    # Strided views of one fused QKV tensor, as the model hands them over.
    return Batch(qkv[:, :heads], qkv[:, heads:heads + kv_heads], qkv[:, heads + kv_heads:],
                 cache.to(device=device, dtype=dtype), meta)


def reference(batch: Batch, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch backend in fp32: the cache after this step's writes, and the output."""
    native = TorchNativeBackend()
    cache = batch.kv_cache.float().clone()
    native.write_kv(batch.key.float(), batch.value.float(), cache, batch.meta.slot_mapping)
    return cache, native.forward(batch.query.float(), cache, batch.meta, scale)


def check_backend(batch: Batch, tiles: TritonTiles, atol: float, rtol: float) -> None:
    scale = batch.query.shape[-1] ** -0.5
    ref_cache, ref_out = reference(batch, scale)
    backend = TritonBackend(tiles)
    backend.write_kv(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    torch.testing.assert_close(batch.kv_cache.float(), ref_cache, equal_nan=True)
    out = backend.forward(batch.query, batch.kv_cache, batch.meta, scale)
    n = batch.meta.num_actual_tokens
    torch.testing.assert_close(out[:n].float(), ref_out[:n], atol=atol, rtol=rtol)
    assert bool((out[n:] == 0).all()), "padding rows must come back as zeros"


def check_kernel(batch: Batch, decode: bool, tiles: TritonTiles, atol, rtol) -> None:
    """The kernel entry points directly, into a NaN-poisoned output."""
    scale = batch.query.shape[-1] ** -0.5
    ref_cache, ref_out = reference(batch, scale)
    write_kv_cache(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    out = torch.full_like(batch.query, float("nan"))
    m = batch.meta
    if decode:
        paged_decode(batch.query, batch.kv_cache, out, m.block_table, m.query_start_loc,
                     m.seq_lens, m.num_reqs, scale, tiles.num_splits, tiles.decode_block_n)
    else:
        paged_prefill(batch.query, batch.kv_cache, out, m.block_table, m.query_start_loc,
                      m.seq_lens, m.num_reqs, m.max_query_len, scale,
                      tiles.prefill_block_m, tiles.prefill_block_n)
    n = m.num_actual_tokens
    torch.testing.assert_close(out[:n].float(), ref_out[:n], atol=atol, rtol=rtol)


CPU_TILES = TritonTiles(prefill_block_m=16, prefill_block_n=16, decode_block_n=16,
                        num_splits=4, sdpa_max_reqs=0)
# (query_lens, seq_lens, heads, kv_heads, head_dim, block_size, pad)
DECODE = {
    "gqa8-d64-b16": ([1, 1, 1], [150, 37, 1], 8, 1, 64, 16, 1),
    "gqa1-d128-b32": ([1, 1], [131, 70], 2, 2, 128, 32, 0),
    "gqa4-d64-b32": ([1, 1], [97, 200], 4, 1, 64, 32, 2),
}
MIXED = {  # chunked prefill and prefix hits beside decodes in one step
    "gqa4-d64-b16": ([1, 20, 9], [70, 53, 9], 4, 1, 64, 16, 2),
    "gqa8-d128-b32": ([5, 1], [40, 33], 8, 1, 128, 32, 1),
    "gqa1-d64-b32": ([17, 3], [50, 3], 2, 2, 64, 32, 0),
}
PREFILL = {  # no cached context at all
    "gqa4-d64-b16": ([19, 6], [19, 6], 4, 1, 64, 16, 1),
    "gqa1-d128-b32": ([33], [33], 1, 1, 128, 32, 0),
}


@cpu_only
@pytest.mark.parametrize("case", DECODE.values(), ids=DECODE.keys())
def test_decode(case):
    q_lens, s_lens, h, hkv, d, bs, pad = case
    check_backend(make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad), CPU_TILES, 1e-4, 1e-4)
    check_kernel(make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad), True, CPU_TILES,
                 1e-4, 1e-4)


@cpu_only
@pytest.mark.parametrize("case", MIXED.values(), ids=MIXED.keys())
def test_mixed_prefill_with_context(case):
    q_lens, s_lens, h, hkv, d, bs, pad = case
    check_backend(make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad), CPU_TILES, 1e-4, 1e-4)


@cpu_only
@pytest.mark.parametrize("case", PREFILL.values(), ids=PREFILL.keys())
@pytest.mark.parametrize("sdpa", [False, True], ids=["kernel", "sdpa"])
def test_pure_prefill(case, sdpa):
    q_lens, s_lens, h, hkv, d, bs, pad = case
    tiles = TritonTiles(prefill_block_m=16, prefill_block_n=16, sdpa_max_reqs=8 if sdpa else 0,
                        sdpa_min_tokens=0)
    check_backend(make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad), tiles, 1e-4, 1e-4)
    if not sdpa:
        check_kernel(make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad), False, tiles,
                     1e-4, 1e-4)


def test_sdpa_min_tokens_sends_short_fresh_prefills_to_the_kernel(monkeypatch):
    batch = make_batch([20, 9], [20, 9], 4, 2, 64, 16)  # a fresh prefill of 29 tokens
    assert not TritonBackend(TritonTiles())._use_sdpa(batch.meta)  # the default: 2048
    assert TritonBackend(TritonTiles(sdpa_min_tokens=0))._use_sdpa(batch.meta)
    assert not TritonBackend(TritonTiles(sdpa_min_tokens=30))._use_sdpa(batch.meta)
    assert TritonBackend(TritonTiles(sdpa_min_tokens=29))._use_sdpa(batch.meta)
    monkeypatch.setenv("LOOM_SDPA_MIN_TOKENS", "29")
    assert TritonBackend()._use_sdpa(batch.meta)
    monkeypatch.setenv("LOOM_SDPA_MIN_TOKENS", "1000")
    assert not TritonBackend()._use_sdpa(batch.meta)
    monkeypatch.setenv("LOOM_SDPA_MIN_TOKENS", "lots")
    with pytest.raises(ValueError, match="LOOM_SDPA_MIN_TOKENS"):
        TritonBackend()


@cpu_only
@pytest.mark.parametrize("mask_all", [False, True], ids=["unmasked-interior", "mask-all"])
def test_prefill_interior_tiles_take_no_masks(mask_all):
    """Chunks after cached context, a query tile much shorter than the key tiles before it,
    a partial last tile: the unmasked interior tiles and the masked diagonal give the
    reference's output, as does masking every tile."""
    batch = make_batch([37, 20, 5], [37 + 70, 20, 5 + 33], 4, 2, 32, 16, pad=2)
    m, scale = batch.meta, batch.query.shape[-1] ** -0.5
    _, ref = reference(batch, scale)
    write_kv_cache(batch.key, batch.value, batch.kv_cache, m.slot_mapping)
    out = torch.full_like(batch.query, float("nan"))
    paged_prefill(batch.query, batch.kv_cache, out, m.block_table, m.query_start_loc,
                  m.seq_lens, m.num_reqs, m.max_query_len, scale, block_m=16, block_n=16,
                  mask_all=mask_all)
    n = m.num_actual_tokens
    torch.testing.assert_close(out[:n], ref[:n], atol=1e-4, rtol=1e-4)


def _spy_kernels(monkeypatch) -> list[dict]:
    """Record every paged_prefill / paged_decode launch the backend makes (arguments by
    name), and NaN-fill each fresh output's token rows before the first launch that writes
    it (the backend itself leaves them uninitialised), so a row no launch writes shows."""
    import inspect

    from loom.attention import triton_backend
    calls, last_out = [], []

    def wrap(name):
        real = getattr(triton_backend, name)
        sig = inspect.signature(real)

        def spy(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            a = dict(bound.arguments)
            if not last_out or last_out[0] is not a["out"]:
                a["out"][:int(a["query_start_loc"][-1])] = float("nan")  # not the padding
                last_out[:] = [a["out"]]
            idx = a["req_index"]
            calls.append(dict(a, kernel=name, index=None if idx is None else idx.tolist()))
            return real(*args, **kwargs)
        monkeypatch.setattr(triton_backend, name, spy)

    wrap("paged_decode")
    wrap("paged_prefill")
    return calls


@cpu_only
def test_16bit_decodes_take_128_key_tiles_three_deep(monkeypatch):
    """16 requests x 4 KV heads of 16-bit keys, and 3 requests: 128-key tiles three stages
    deep either way (the interpreter runs float16; the kernel is the same for bf16);
    float32 keys keep 16 KB tiles two deep."""
    calls = _spy_kernels(monkeypatch)
    lens = [1 + 37 * i % 300 for i in range(16)]
    for n, dtype, tiles in ((16, torch.float16, (128, 3)), (3, torch.float16, (128, 3)),
                            (3, torch.float32, (64, 2))):
        tol = 2e-3 if dtype == torch.float16 else 1e-4
        check_backend(make_batch([1] * n, lens[:n], 8, 4, 64, 16, dtype=dtype),
                      TritonTiles(), tol, tol)
        (call,) = calls
        assert (call["block_n"], call["num_stages"]) == tiles, (n, dtype)
        calls.clear()


@cpu_only
def test_wide_decode_batches_over_an_8bit_cache_take_two_warps(monkeypatch):
    """The same wide batch over an 8-bit cache: 64 keys three deep on 2 warps, split
    toward WIDE_8BIT_SPLIT_PROGRAMS programs in at most WIDE_8BIT_MAX_SPLITS; the narrow
    one: 128 keys two deep on 4 warps, split as 16-bit decodes are; LOOM_DECODE_TILES and
    LOOM_DECODE_SPLITS override them."""
    from loom.attention.triton_backend import WIDE_8BIT_MAX_SPLITS, WIDE_8BIT_SPLIT_PROGRAMS
    from loom.kernels.paged_decode import SPLIT_PROGRAMS
    from tests.kernels.test_kv_cache_fp8 import check
    calls = _spy_kernels(monkeypatch)
    fmt = torch.float8_e4m3fn
    lens = [1 + 97 * i % 1100 for i in range(16)]  # up to 1068 tokens: 17 64-key tiles
    for n, tiles, programs, most in ((16, (64, 2, 3), WIDE_8BIT_SPLIT_PROGRAMS,
                                      WIDE_8BIT_MAX_SPLITS), (3, (128, 4, 2), SPLIT_PROGRAMS, 32)):
        batch = make_batch([1] * n, lens[:n], 8, 4, 64, 16, dtype=torch.float16)
        batch.kv_cache = batch.kv_cache.to(fmt)
        check(batch, fmt, TritonBackend(TritonTiles()), atol=3e-3, rtol=3e-3)
        (call,) = calls
        assert (call["block_n"], call["num_warps"], call["num_stages"]) == tiles
        assert call["num_splits"] == min(-(-programs // (n * 4)), most,
                                         -(-max(lens[:n]) // tiles[0]))
        assert call["num_splits"] > 1  # the merge of several splits, on the 2-warp tiles too
        calls.clear()
    # 16-bit caches aim at SPLIT_PROGRAMS whatever the batch
    backend = TritonBackend()
    assert backend.decode_splits(16, 8, 8192, backend.decode_tiles(16, 8, 128, torch.bfloat16),
                                 torch.bfloat16) == 3
    assert backend.decode_splits(16, 8, 8192, backend.decode_tiles(
        16, 8, 128, torch.bfloat16, fmt), fmt) == 8
    monkeypatch.setenv("LOOM_DECODE_TILES", "32,8,1")
    monkeypatch.setenv("LOOM_DECODE_SPLITS", "5")
    backend = TritonBackend()
    tiles = backend.decode_tiles(16, 4, 64, torch.float16, fmt)
    assert tiles == (32, 8, 1) and backend.decode_splits(16, 4, 8192, tiles, fmt) == 5
    monkeypatch.delenv("LOOM_DECODE_SPLITS")
    for bad in ("32,3", "8,4,2", "32,3,0", "a,b,c"):  # refused when the backend is made
        monkeypatch.setenv("LOOM_DECODE_TILES", bad)
        with pytest.raises(ValueError, match="LOOM_DECODE_TILES"):
            TritonBackend()
    monkeypatch.delenv("LOOM_DECODE_TILES")
    for bad in ("0", "33", "x"):
        monkeypatch.setenv("LOOM_DECODE_SPLITS", bad)
        with pytest.raises(ValueError, match="LOOM_DECODE_SPLITS"):
            TritonBackend()


@cpu_only
def test_decode_single_split_and_more_splits_than_tiles():
    """One split covers everything; too many splits leave some empty (m=-inf, l=0)."""
    for splits in (1, 8):
        tiles = TritonTiles(decode_block_n=16, num_splits=splits)
        check_kernel(make_batch([1, 1], [40, 17], 4, 2, 64, 16), True, tiles, 1e-4, 1e-4)


# ---- CUDA, compiled, bf16, larger shapes ----
GPU_CASES = {
    "decode-gqa8-d128-b16": ([1] * 6, [4100, 1, 777, 2048, 33, 9000], 32, 4, 128, 16, 3),
    "decode-gqa4-d64-b32": ([1] * 3, [1500, 64, 3001], 16, 4, 64, 32, 0),
    "decode-gqa1-d128-b32": ([1] * 2, [5000, 257], 8, 8, 128, 32, 1),
    # 20 requests x 4 KV heads: a wide batch (over an 8-bit cache it takes 64-key tiles on
    # 2 warps; the entry-point checks below fix their own tiles)
    "decode-wide-gqa8-d128-b16": ([1] * 20, [1 + 97 * i % 3000 for i in range(20)], 32, 4,
                                  128, 16, 2),
    "mixed-gqa8-d128-b16": ([1, 300, 1, 77], [2000, 1300, 45, 77], 32, 4, 128, 16, 5),
    "mixed-gqa4-d64-b32": ([64, 1, 200], [4096, 129, 900], 16, 4, 64, 32, 0),
    "mixed-gqa1-d256-b16": ([50, 1], [300, 600], 4, 4, 256, 16, 2),
    # a verify's few tokens a query (the split-K kernel at q_tokens 8), groups of 4 and 8
    "verify-gqa4-d128-b16": ([5, 5, 1, 3], [300, 4000, 70, 9], 32, 8, 128, 16, 1),
    "verify-gqa8-d128-b16": ([4, 2, 8], [1000, 50, 8], 32, 4, 128, 16, 0),
    "prefill-gqa8-d128-b16": ([1000, 37, 512], [1000, 37, 512], 32, 4, 128, 16, 2),
    "prefill-gqa4-d64-b32": ([700], [700], 16, 4, 64, 32, 0),
}


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", GPU_CASES.values(), ids=GPU_CASES.keys())
@pytest.mark.parametrize("sdpa", [0, 4], ids=["kernel", "sdpa"])
def test_gpu_bf16(case, sdpa):
    q_lens, s_lens, h, hkv, d, bs, pad = case
    batch = make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad, dtype=torch.bfloat16,
                       device="cuda")
    check_backend(batch, TritonTiles(sdpa_max_reqs=sdpa, sdpa_min_tokens=0), 2e-2, 2e-2)
    if not sdpa:  # the entry points themselves, into a NaN-poisoned output
        big = d > 128
        tiles = TritonTiles(prefill_block_m=64 if big else 128, prefill_block_n=32 if big else 64,
                            decode_block_n=32 if big else 64, num_splits=7)
        batch = make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad, dtype=torch.bfloat16,
                           device="cuda")
        check_kernel(batch, max(q_lens) == 1, tiles, 2e-2, 2e-2)

