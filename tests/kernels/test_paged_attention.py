"""The Triton paged-attention backend against the torch reference, on random batches.

On the CPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1) with tiny shapes
that still span several cache blocks, key tiles and decode splits; with CUDA the same
checks run compiled in bf16 on larger shapes (`-m gpu`).
"""

import itertools
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


@cpu_only
def test_wide_decode_batches_take_the_wider_tiles(monkeypatch):
    """16 requests x 4 KV heads of 16-bit keys: 128-key tiles three stages deep (the
    interpreter runs float16; the kernel is the same for bf16); a narrow batch keeps 64."""
    calls = _spy_kernels(monkeypatch)
    lens = [1 + 37 * i % 300 for i in range(16)]
    check_backend(make_batch([1] * 16, lens, 8, 4, 64, 16, dtype=torch.float16),
                  TritonTiles(), 2e-3, 2e-3)
    (wide,) = calls
    assert (wide["block_n"], wide["num_stages"]) == (128, 3)
    calls.clear()
    check_backend(make_batch([1] * 3, lens[:3], 8, 4, 64, 16, dtype=torch.float16),
                  TritonTiles(), 2e-3, 2e-3)
    (narrow,) = calls
    assert (narrow["block_n"], narrow["num_stages"]) == (64, 2)


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
    # 20 requests x 4 KV heads: enough programs for the backend's wide tiles (128 keys, 3
    # stages; the entry-point checks below fix their own)
    "decode-wide-gqa8-d128-b16": ([1] * 20, [1 + 97 * i % 3000 for i in range(20)], 32, 4,
                                  128, 16, 2),
    "mixed-gqa8-d128-b16": ([1, 300, 1, 77], [2000, 1300, 45, 77], 32, 4, 128, 16, 5),
    "mixed-gqa4-d64-b32": ([64, 1, 200], [4096, 129, 900], 16, 4, 64, 32, 0),
    "mixed-gqa1-d256-b16": ([50, 1], [300, 600], 4, 4, 256, 16, 2),
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


# ---- mixed steps: decodes to the split-K kernels, prompt chunks to the varlen kernel ----
SPLIT = {  # decodes interleaved with prompt chunks, some of them after cached context
    "gqa4-d32-b16": ([1, 12, 1, 1, 7, 1], [40, 30, 17, 1, 7, 66], 8, 2, 32, 16, 3),
    # a request with no query this step (index 4) goes to neither kernel
    "gqa2-d64-b32": ([9, 1, 1, 20, 0, 1], [9, 50, 33, 45, 5, 70], 4, 2, 64, 32, 0),
}
SPLIT_TILES = TritonTiles(prefill_block_m=16, prefill_block_n=16, decode_block_n=16,
                          sdpa_max_reqs=0)  # num_splits None: default_num_splits picks


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
@pytest.mark.parametrize("case", SPLIT.values(), ids=SPLIT.keys())
def test_mixed_step_splits_decodes_from_prompt_chunks(case, monkeypatch):
    from loom.attention import triton_backend
    from loom.kernels.paged_decode import default_num_splits
    q_lens, s_lens, h, hkv, d, bs, pad = case
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", "1")  # a few decodes split too
    calls = _spy_kernels(monkeypatch)
    uploads = []
    real_upload = triton_backend._upload_indices
    monkeypatch.setattr(triton_backend, "_upload_indices",
                        lambda *a: uploads.append(1) or real_upload(*a))
    decodes = [i for i, q in enumerate(q_lens) if q == 1]
    prompts = [i for i, q in enumerate(q_lens) if q > 1]
    for _ in range(2):  # fresh inputs each time
        batch = make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad)
        calls.clear()
        uploads.clear()
        check_backend(batch, SPLIT_TILES, 1e-4, 1e-4)
        assert [c["kernel"] for c in calls] == ["paged_decode", "paged_prefill"]
        dec, pre = calls
        assert dec["index"] == decodes and dec["num_reqs"] == len(decodes)
        assert dec["num_splits"] == default_num_splits(
            len(decodes), hkv, max(s_lens[i] for i in decodes), SPLIT_TILES.decode_block_n)
        assert pre["index"] == prompts and pre["num_reqs"] == len(prompts)
        assert pre["max_query_len"] == max(q_lens[i] for i in prompts)
        assert uploads == [1]


@cpu_only
def test_split_is_made_once_per_step(monkeypatch):
    """Every layer of a step reuses the first layer's split (one upload); a new step's
    metadata gets its own."""
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", "1")  # a few decodes split too
    backend = TritonBackend(SPLIT_TILES)
    q_lens, s_lens, h, hkv, d, bs, pad = SPLIT["gqa4-d32-b16"]
    batch = make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad)
    first = backend._split(batch.meta, batch.query.device)
    assert first is not None and backend._split(batch.meta, batch.query.device) is first
    other = make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad)
    assert backend._split(other.meta, other.query.device) is not first


@cpu_only
def test_prompt_chunks_alone_take_one_unindexed_launch(monkeypatch):
    calls = _spy_kernels(monkeypatch)
    q_lens, s_lens = [20, 9, 3], [53, 9, 40]
    check_backend(make_batch(q_lens, s_lens, 8, 2, 32, 16, pad=1), SPLIT_TILES, 1e-4, 1e-4)
    assert len(calls) == 1 and calls[0]["kernel"] == "paged_prefill"
    assert calls[0]["index"] is None and calls[0]["num_reqs"] == 3
    assert calls[0]["max_query_len"] == 20


@cpu_only
@pytest.mark.parametrize("case", SPLIT.values(), ids=SPLIT.keys())
def test_indexed_kernels_write_only_their_requests(case):
    """Each entry point over a non-contiguous subset, into a NaN-poisoned output: the
    subset's rows match the reference, every other row is left alone."""
    q_lens, s_lens, h, hkv, d, bs, pad = case
    starts = [0, *itertools.accumulate(q_lens)]
    for decode in (True, False):
        batch = make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad)
        scale = d ** -0.5
        _, ref_out = reference(batch, scale)
        write_kv_cache(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
        reqs = [i for i, q in enumerate(q_lens) if (q == 1) == decode and q > 0]
        index = torch.tensor(reqs, dtype=torch.int32)
        out = torch.full_like(batch.query, float("nan"))
        m = batch.meta
        if decode:
            paged_decode(batch.query, batch.kv_cache, out, m.block_table, m.query_start_loc,
                         m.seq_lens, len(reqs), scale, 3, 16, req_index=index)
        else:
            paged_prefill(batch.query, batch.kv_cache, out, m.block_table, m.query_start_loc,
                          m.seq_lens, len(reqs), max(q_lens[i] for i in reqs), scale, 16, 16,
                          req_index=index)
        mine = torch.zeros(out.shape[0], dtype=torch.bool)
        for i in reqs:
            mine[starts[i]:starts[i + 1]] = True
        torch.testing.assert_close(out[mine], ref_out[mine], atol=1e-4, rtol=1e-4)
        assert bool(out[~mine].isnan().all()), "rows of other requests were written"


def test_req_index_must_match_num_reqs():
    batch = make_batch([1, 5], [9, 5], 4, 2, 32, 16)
    m = batch.meta
    with pytest.raises(ValueError, match="req_index"):
        paged_decode(batch.query, batch.kv_cache, batch.query.clone(), m.block_table,
                     m.query_start_loc, m.seq_lens, 2, 1.0, 1, 16,
                     req_index=torch.tensor([0], dtype=torch.int32))
