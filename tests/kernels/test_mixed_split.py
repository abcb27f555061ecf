"""Mixed steps on the Triton backend: which it splits (decodes to the split-K kernels, prompt
chunks to the varlen kernel; from LOOM_MIXED_SPLIT_MIN_DECODES decodes, or a decode of
LOOM_MIXED_SPLIT_MIN_CONTEXT tokens), and the split's launches against the torch reference.
On the CPU the kernels run in Triton's interpreter."""

from __future__ import annotations

import itertools

import pytest
import torch

# First: it picks the interpreter (TRITON_INTERPRET) before anything imports Triton.
from tests.kernels.test_paged_attention import (  # noqa: F401  (_seed: the autouse fixture)
    _seed, _spy_kernels, check_backend, cpu_only, make_batch, reference)

from loom.attention.mixed_split import split_by_query_len  # noqa: E402
from loom.attention.triton_backend import TritonBackend, TritonTiles  # noqa: E402
from loom.kernels.kv_write import write_kv_cache  # noqa: E402
from loom.kernels.paged_attention import paged_prefill  # noqa: E402
from loom.kernels.paged_decode import paged_decode  # noqa: E402
from loom.worker.warmup import step_metadata  # noqa: E402

CPU = torch.device("cpu")


def _meta(query_lens: list[int]):
    return step_metadata(query_lens, [q + 7 for q in query_lens], sum(query_lens), 16, CPU)


def test_split_names_each_kind_and_needs_enough_decodes():
    meta = _meta([1, 5, 1, 1, 3])  # three decodes, two prompt chunks
    split = split_by_query_len(meta, CPU)
    assert split.decode_index.tolist() == [0, 2, 3] and split.prefill_index.tolist() == [1, 4]
    assert split.decode_max_seq_len == 8 and split.prefill_max_query_len == 5
    assert split_by_query_len(meta, CPU, min_decodes=3) is not None
    assert split_by_query_len(meta, CPU, min_decodes=4) is None  # one varlen launch serves
    assert split_by_query_len(_meta([5, 3]), CPU) is None  # no decodes
    assert split_by_query_len(_meta([1, 1]), CPU) is None  # no prompt chunk


def test_a_long_decode_splits_the_step_whatever_the_count():
    meta = _meta([1, 5, 1])  # decodes of 8 tokens each (q + 7)
    assert split_by_query_len(meta, CPU, min_decodes=3, min_context=9) is None
    split = split_by_query_len(meta, CPU, min_decodes=3, min_context=8)
    assert split is not None and split.decode_index.tolist() == [0, 2]
    assert split_by_query_len(_meta([5, 3]), CPU, min_context=1) is None  # still no decodes


def test_the_threshold_comes_from_the_environment(monkeypatch):
    assert TritonBackend().mixed_split_min_decodes == 16  # the defaults
    assert TritonBackend().mixed_split_min_context == 1024
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_CONTEXT", "4096")
    assert TritonBackend().mixed_split_min_context == 4096
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", "64")
    assert TritonBackend().mixed_split_min_decodes == 64
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", "many")
    with pytest.raises(ValueError, match="LOOM_MIXED_SPLIT_MIN_DECODES"):
        TritonBackend()


# ---- mixed steps: decodes to the split-K kernels, prompt chunks to the varlen kernel ----
SPLIT = {  # decodes interleaved with prompt chunks, some of them after cached context
    "gqa4-d32-b16": ([1, 12, 1, 1, 7, 1], [40, 30, 17, 1, 7, 66], 8, 2, 32, 16, 3),
    # a request with no query this step (index 4) goes to neither kernel
    "gqa2-d64-b32": ([9, 1, 1, 20, 0, 1], [9, 50, 33, 45, 5, 70], 4, 2, 64, 32, 0),
}
SPLIT_TILES = TritonTiles(prefill_block_m=16, prefill_block_n=16, decode_block_n=16,
                          sdpa_max_reqs=0)  # num_splits None: default_num_splits picks


@cpu_only
@pytest.mark.parametrize("case", SPLIT.values(), ids=SPLIT.keys())
def test_mixed_step_splits_decodes_from_prompt_chunks(case, monkeypatch):
    from loom.attention import mixed_split
    from loom.kernels.paged_decode import default_num_splits
    q_lens, s_lens, h, hkv, d, bs, pad = case
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", "1")  # a few decodes split too
    calls = _spy_kernels(monkeypatch)
    uploads = []
    real_upload = mixed_split.upload
    monkeypatch.setattr(mixed_split, "upload",
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
@pytest.mark.parametrize("min_decodes", [1, 16], ids=["split", "one-kind-launch"])
def test_short_queries_take_the_split_k_kernel(min_decodes, monkeypatch):
    """A verify step's queries of a few tokens (eagerly run, no graph) take the split-K
    decode kernel at q_tokens, beside its decodes (split off: request-indexed launches) or
    with them in one launch; a window layer keeps the varlen kernel (its splits divide the
    last token's window only)."""
    monkeypatch.setenv("LOOM_MIXED_SPLIT_MIN_DECODES", str(min_decodes))
    calls = _spy_kernels(monkeypatch)
    q_lens, s_lens = [1, 5, 1, 3, 2], [40, 30, 17, 60, 9]
    check_backend(make_batch(q_lens, s_lens, 8, 2, 32, 16, pad=1), SPLIT_TILES, 1e-4, 1e-4)
    assert [c["kernel"] for c in calls] == ["paged_decode"] * (2 if min_decodes == 1 else 1)
    short = calls[-1]
    assert short["q_tokens"] == 8 and short["window"] is None
    assert short["index"] == ([1, 3, 4] if min_decodes == 1 else None)
    from loom.attention.backend import ScoreOpts
    calls.clear()
    batch = make_batch(q_lens, s_lens, 8, 2, 32, 16, pad=1)
    TritonBackend(SPLIT_TILES).forward(batch.query, batch.kv_cache, batch.meta, 1.0,
                                       opts=ScoreOpts(sliding_window=16))
    assert calls[-1]["kernel"] == "paged_prefill"


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
