"""Which mixed steps the Triton backend splits (decodes to the split-K kernels, prompt
chunks to the varlen kernel): from LOOM_MIXED_SPLIT_MIN_DECODES decodes up."""

from __future__ import annotations

import pytest
import torch

from loom.attention.triton_backend import TritonBackend, split_by_query_len
from loom.worker.warmup import step_metadata

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
