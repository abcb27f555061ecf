"""paged_decode's one-launch merge: the last active split of each (request, KV head) merges
the splits' partials and puts its arrival counter back to 0; splits past a request's keys
exit at once, a request with one active split writes its output itself, an empty request
writes nothing. Against the torch backend, in Triton's CPU interpreter."""

import pytest
import torch

# First: it picks the interpreter (TRITON_INTERPRET) before anything imports Triton.
from tests.kernels.test_paged_attention import (  # noqa: F401  (_seed: the autouse fixture)
    _seed, cpu_only, make_batch, reference)
from tests.kernels.test_paged_attention_rope import check_decode_with_new_tokens

from loom.kernels import arrival  # noqa: E402
from loom.kernels import paged_decode as paged_decode_module  # noqa: E402
from loom.kernels.kv_write import write_kv_cache  # noqa: E402
from loom.kernels.paged_decode import paged_decode  # noqa: E402

BLOCK_N = 16
# With 8 splits of 16-key tiles: 1, 3 and 5 active splits (split_len 16, 16 and 32).
SEQ_LENS = [3, 40, 130]


def _counters() -> torch.Tensor:
    return arrival.counters(torch.device("cpu"), 1, "paged_decode")


@pytest.fixture(autouse=True)
def _nan_partials(monkeypatch):
    """Every launch's partials start as NaN, so a merge that read a split nobody wrote
    (one past the request's active splits) would show."""
    real = paged_decode_module._partials

    def poisoned(*args):
        parts = real(*args)
        if parts[0] is not args[1]:  # not the one-split placeholders (out itself)
            for p in parts:
                p.fill_(float("nan"))
        return parts
    monkeypatch.setattr(paged_decode_module, "_partials", poisoned)


def _decode_batch(q_lens=None, seq_lens=SEQ_LENS, pad=1, heads=4):
    batch = make_batch(q_lens or [1] * len(seq_lens), seq_lens, heads, 2, 32, 16, pad=pad)
    write_kv_cache(batch.key, batch.value, batch.kv_cache, batch.meta.slot_mapping)
    return batch


def _run(batch, splits, req_index=None, num_reqs=None, **kwargs):
    """paged_decode into a NaN-poisoned output."""
    m = batch.meta
    out = torch.full_like(batch.query, float("nan"))
    paged_decode(batch.query, batch.kv_cache, out, m.block_table, m.query_start_loc,
                 m.seq_lens, m.num_reqs if num_reqs is None else num_reqs,
                 batch.query.shape[-1] ** -0.5, splits, BLOCK_N, req_index=req_index, **kwargs)
    return out


@cpu_only
def test_counters_back_to_zero_and_repeated_calls_agree():
    """Call after call, with the same and other split counts (SPLITS_PAD 8, 4, 1, 2, 32),
    each output is the reference's and every counter is 0 again: a counter left at a
    count would make the next call's merge come early or never."""
    batch = _decode_batch()
    n = batch.meta.num_actual_tokens
    _, ref = reference(batch, batch.query.shape[-1] ** -0.5)
    counters = _counters()
    counters.zero_()
    for splits in (8, 8, 3, 1, 2, 32, 8):
        out = _run(batch, splits)
        torch.testing.assert_close(out[:n], ref[:n], atol=1e-4, rtol=1e-4,
                                   msg=lambda m: f"{splits} splits: {m}")
        assert bool(out[n:].isnan().all()), "the padding row was written"
        assert int(counters.count_nonzero()) == 0, (splits, counters.nonzero().tolist())


@cpu_only
def test_the_merge_rescales_each_split_to_the_max():
    """Queries 60 times larger: log2-domain scores in the hundreds, whose exp2 overflows
    float32 unless each split is rescaled to the heads' max before summing."""
    batch = _decode_batch()
    batch.query.mul_(60.0)
    n = batch.meta.num_actual_tokens
    _, ref = reference(batch, batch.query.shape[-1] ** -0.5)
    torch.testing.assert_close(_run(batch, 8)[:n], ref[:n], atol=1e-4, rtol=1e-4)


@cpu_only
def test_each_merge_counts_on_its_own_counter_and_one_split_on_none():
    """The merge hangs on the counter (this test's own check that it is the one used): one
    left at 1 (slot 2, 5 active splits, KV head 0) makes a split merge before the last
    has stored its partials, and that head group's output is wrong; the request of one
    active split (slot 0) writes its output without touching its counters; zeroed, right
    again."""
    batch = _decode_batch()
    n = batch.meta.num_actual_tokens
    _, ref = reference(batch, batch.query.shape[-1] ** -0.5)
    counters = _counters()
    counters.zero_()
    counters[2 * 2 + 0] = 1  # slot 2 x 2 KV heads + KV head 0
    counters[0:2] = 7  # slot 0's two KV heads
    out = _run(batch, 8)
    assert not torch.allclose(out[2, :2], ref[2, :2], atol=1e-3, rtol=1e-3, equal_nan=True)
    torch.testing.assert_close(out[2, 2:], ref[2, 2:], atol=1e-4, rtol=1e-4)  # KV head 1
    torch.testing.assert_close(out[:2], ref[:2], atol=1e-4, rtol=1e-4)  # 1 and 3 splits
    assert counters[0:2].tolist() == [7, 7]
    counters.zero_()
    torch.testing.assert_close(_run(batch, 8)[:n], ref[:n], atol=1e-4, rtol=1e-4)


@cpu_only
@pytest.mark.parametrize("index, heads", [(None, 4), ([2, 0, 1], 4), ([1, 2], 4), (None, 6)],
                         ids=["all", "permuted-index", "subset-index", "group-of-3"])
def test_one_and_several_active_splits_in_one_batch(index, heads):
    """Requests of 1, 3 and 5 active splits out of 8 side by side, all of them or those a
    request index names (slot i then serves request index[i], and its counters and
    partials are slot i's): their rows are the reference's, every other row is left
    alone. A group of 3 query heads a KV head pads the merge's rows to 4."""
    batch = _decode_batch(heads=heads)
    _, ref = reference(batch, batch.query.shape[-1] ** -0.5)
    counters = _counters()
    counters.zero_()
    req_index = None if index is None else torch.tensor(index, dtype=torch.int32)
    out = _run(batch, 8, req_index, None if index is None else len(index))
    mine = torch.zeros(out.shape[0], dtype=torch.bool)
    mine[range(len(SEQ_LENS)) if index is None else index] = True  # one row each
    torch.testing.assert_close(out[mine], ref[mine], atol=1e-4, rtol=1e-4)
    assert bool(out[~mine].isnan().all()), "rows of other requests were written"
    assert int(counters.count_nonzero()) == 0


@cpu_only
@pytest.mark.parametrize("splits", [8, 32])
def test_one_and_several_active_splits_rotating_the_new_tokens(splits):
    """The same batch with new_tokens: the split that holds each request's new token (always
    an active one) rotates and caches it, the rest read it from the cache."""
    counters = _counters()
    counters.zero_()
    batch = make_batch([1] * 3, SEQ_LENS, 4, 2, 32, 16, pad=1)
    check_decode_with_new_tokens(batch, splits, BLOCK_N, 1e-5, 1e-5)
    assert int(counters.count_nonzero()) == 0


@cpu_only
@pytest.mark.parametrize("index", [None, [3, 1, 0, 2]], ids=["all", "index"])
def test_an_empty_request_writes_nothing(index):
    """Requests with no query this step (query_start_loc equal for consecutive entries),
    one before a decode and one at the end, whose start is the padding row: that row stays
    NaN, the decodes match the reference and no counter is left counting."""
    q_lens, seq_lens = [1, 0, 1, 0], [40, 50, 130, 70]  # rows: req 0, req 2, padding
    batch = _decode_batch(q_lens, seq_lens, pad=1)
    _, ref = reference(batch, batch.query.shape[-1] ** -0.5)
    counters = _counters()
    counters.zero_()
    req_index = None if index is None else torch.tensor(index, dtype=torch.int32)
    for splits in (1, 8):
        out = _run(batch, splits, req_index)
        torch.testing.assert_close(out[:2], ref[:2], atol=1e-4, rtol=1e-4)
        assert bool(out[2].isnan().all()), "an empty request wrote the padding row"
        assert int(counters.count_nonzero()) == 0


# Queries of several tokens (a verify's): a fresh prompt of 3, 5 tokens after 35 cached and 8
# after 122. With 8 splits the last request's last split holds keys 128-129, which its first
# rows (positions 122-127) do not see: their partials there are empty.
MULTI_Q_LENS = [3, 5, 8]


@cpu_only
@pytest.mark.parametrize("splits, index, heads, scale",
                         [(8, None, 4, 1.0), (1, None, 4, 1.0), (3, None, 6, 1.0),
                          (32, [2, 0], 4, 1.0), (8, None, 4, 60.0)],
                         ids=["8-splits", "one-split", "group-of-3", "subset-index",
                              "large-scores"])
def test_queries_of_several_tokens_attend_causally(splits, index, heads, scale):
    """Each token of a query sees the keys up to its own position, as the reference's
    causal attention: rows of GQA group x token, a split past some rows' last key merged
    with weight 0 for them (NaN partials elsewhere would show), queries 60 times larger
    still rescaled; every counter back to 0, other requests' rows and the padding left."""
    batch = _decode_batch(q_lens=MULTI_Q_LENS, heads=heads)
    batch.query.mul_(scale)
    _, ref = reference(batch, batch.query.shape[-1] ** -0.5)
    counters = _counters()
    counters.zero_()
    req_index = None if index is None else torch.tensor(index, dtype=torch.int32)
    out = _run(batch, splits, req_index, None if index is None else len(index), q_tokens=8)
    starts = batch.meta.query_start_loc.tolist()
    mine = torch.zeros(out.shape[0], dtype=torch.bool)
    for i in range(len(SEQ_LENS)) if index is None else index:
        mine[starts[i]:starts[i + 1]] = True
    torch.testing.assert_close(out[mine], ref[mine], atol=1e-4, rtol=1e-4)
    assert bool(out[~mine].isnan().all()), "rows of other requests or padding were written"
    assert int(counters.count_nonzero()) == 0


@cpu_only
def test_several_token_queries_are_refused_what_they_cannot_take():
    """q_tokens is a power of two, and queries of several tokens take no new tokens to
    rotate and no window."""
    batch = _decode_batch(q_lens=MULTI_Q_LENS)
    with pytest.raises(ValueError, match="q_tokens 6 must be a power of two"):
        _run(batch, 8, q_tokens=6)
    with pytest.raises(ValueError, match="take neither new_tokens nor a window"):
        _run(batch, 8, q_tokens=8, window=16)
