"""The Triton backend on a CUDA graph's fixed-shape batches: one packed prefill launch for
every request (`paged_prefill(packed_tokens=...)`), against the torch reference. On the
CPU in Triton's interpreter; with CUDA compiled, in bf16 (`-m gpu`). Helpers and cases are
test_paged_attention's."""

import zlib

import pytest
import torch

from loom.attention.backend import AttentionMetadata
from loom.attention.torch_native import TorchNativeBackend
from loom.attention.triton_backend import TritonBackend, TritonTiles
from loom.kernels.paged_attention import paged_prefill
from tests.kernels.test_paged_attention import (CPU_TILES, DECODE, GPU_CASES, MIXED, Batch,
                                                _spy_kernels, cpu_only, make_batch, needs_gpu,
                                                reference)


@pytest.fixture(autouse=True)
def _seeded(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def fixed_shape(meta: AttentionMetadata, num_reqs: int, num_tokens: int) -> AttentionMetadata:
    """meta as a CUDA graph of num_reqs requests and num_tokens tokens holds it: requests
    past the batch's have empty queries (and no keys), rows past its tokens are padding, and
    the host-side tensors are poisoned (the graph's, not this batch's)."""
    extra = num_reqs - meta.num_reqs
    starts = torch.cat([meta.query_start_loc, meta.query_start_loc[-1:].repeat(extra)])
    seq_lens = torch.cat([meta.seq_lens, meta.seq_lens.new_zeros(extra)])
    table = torch.cat([meta.block_table, meta.block_table.new_zeros(extra, meta.block_table.shape[1])])
    return AttentionMetadata(
        num_actual_tokens=num_tokens, num_reqs=num_reqs, max_query_len=num_tokens,
        max_seq_len=10**6, query_start_loc=starts, seq_lens=seq_lens, block_table=table,
        slot_mapping=meta.slot_mapping, query_start_loc_cpu=torch.full_like(starts.cpu(), -7),
        seq_lens_cpu=torch.full_like(seq_lens.cpu(), -7), fixed_shape=True)


def check_fixed_shape(batch: Batch, num_reqs: int, tiles: TritonTiles, atol, rtol) -> None:
    """The backend over a fixed-shape (CUDA graph) form of the batch, into whatever its
    output buffer held: the reference's rows, and zeros in the padding rows."""
    scale = batch.query.shape[-1] ** -0.5
    ref_cache, ref_out = reference(batch, scale)
    backend = TritonBackend(tiles)
    backend.write_kv(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    meta = fixed_shape(batch.meta, num_reqs, batch.query.shape[0])
    assert not backend.attends_batch_kv(meta, batch.kv_cache, batch.key)
    out = backend.forward(batch.query, batch.kv_cache, meta, scale)
    n = batch.meta.num_actual_tokens
    torch.testing.assert_close(out[:n].float(), ref_out[:n], atol=atol, rtol=rtol)
    assert bool((out[n:] == 0).all()), "padding rows must come back as zeros"
    # the torch reference reads a fixed-shape batch from its device tensors alike
    torch.testing.assert_close(TorchNativeBackend().forward(batch.query.float(), ref_cache,
                                                            meta, scale), ref_out)


FIXED = {  # (batch, requests in the graph, the split-K launch's q_tokens or None): decodes,
    # chunks after context, fresh prompts; a graph of at most 8 tokens holds queries of at
    # most 8 (a verify's few), which the split-K decode kernel takes
    "mixed-gqa4-d64-b16": (MIXED["gqa4-d64-b16"], 7, None),
    "mixed-gqa8-d128-b32": (MIXED["gqa8-d128-b32"], 2, 8),
    "prefill-gqa4-d64-b16-pad40": (([19, 6], [19, 6], 4, 1, 64, 16, 40), 5, None),
    "decodes-gqa4-d64-b32": (DECODE["gqa4-d64-b32"], 16, 4),
    "verify-gqa4-d64-b16": (([3, 1, 2], [50, 33, 140], 8, 2, 64, 16, 2), 6, 8),
}


@cpu_only
@pytest.mark.parametrize("case", FIXED.values(), ids=FIXED.keys())
def test_fixed_shape_batches_take_one_launch(case, monkeypatch):
    """A CUDA graph's batch of any kind, with requests and rows to spare: one launch for
    all of it (decodes included), whatever the host-side values say. The packed prefill
    launch, or where the graph's queries are short, the split-K decode kernel's over every
    request slot (LOOM_SHORT_QUERY_DECODE=0: the packed prefill's)."""
    (q_lens, s_lens, h, hkv, d, bs, pad), num_reqs, q_tokens = case
    calls = _spy_kernels(monkeypatch)
    for short in ("1", "0"):
        monkeypatch.setenv("LOOM_SHORT_QUERY_DECODE", short)
        calls.clear()
        check_fixed_shape(make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad), num_reqs,
                          CPU_TILES, 1e-4, 1e-4)
        (call,) = calls
        assert call["num_reqs"] == num_reqs and call["req_index"] is None
        if q_tokens and short == "1":
            assert call["kernel"] == "paged_decode" and call["q_tokens"] == q_tokens
        else:
            assert call["kernel"] == "paged_prefill"
            assert call["packed_tokens"] == sum(q_lens) + pad


def test_packed_grid_refuses_a_request_index():
    batch = make_batch([3], [3], 2, 1, 64, 16)
    m = batch.meta
    with pytest.raises(ValueError, match="req_index must be None"):
        paged_prefill(batch.query, batch.kv_cache, torch.empty_like(batch.query),
                      m.block_table, m.query_start_loc, m.seq_lens, 1, 3, 1.0,
                      req_index=torch.zeros(1, dtype=torch.int32), packed_tokens=3)
    with pytest.raises(ValueError, match="host_bounds"):
        fixed_shape(m, 2, 3).host_bounds


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("case", GPU_CASES.values(), ids=GPU_CASES.keys())
def test_gpu_bf16_fixed_shape(case):
    """As a CUDA graph's batch, with requests and rows to spare."""
    q_lens, s_lens, h, hkv, d, bs, pad = case
    check_fixed_shape(make_batch(q_lens, s_lens, h, hkv, d, bs, pad=pad + 37,
                                 dtype=torch.bfloat16, device="cuda"),
                      len(q_lens) + 9, TritonTiles(), 2e-2, 2e-2)


def test_mixed_batches_the_backend_splits_stay_out_of_fixed_shape_graphs(monkeypatch):
    """A fixed-shape graph runs decodes in the packed prefill launch: only batches the
    backend would not split anyway go there (few decodes, none of a long context)."""
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", "3")
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_CONTEXT", "100")
    backend = TritonBackend()

    def fits(q_lens, s_lens):
        return backend.fits_one_launch(make_batch(q_lens, s_lens, 2, 1, 64, 16).meta)
    assert fits([5, 9], [5, 9])  # prompts only
    assert fits([1, 1, 9], [40, 99, 9])  # two short decodes
    assert not fits([1, 1, 1, 9], [40, 50, 60, 9])  # three decodes: split
    assert not fits([1, 9], [100, 9])  # a decode of 100 tokens: split
    assert not fits([1], [500])  # split-K's (decode graphs take pure decodes first)
