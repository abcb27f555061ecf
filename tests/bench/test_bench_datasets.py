"""Serving-benchmark prompts have the requested token lengths (real Llama 3 tokenizer), and
arrivals follow the requested process."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from loom.bench.datasets import (
    SONNET_INSTRUCTION,
    DatasetConfig,
    count_tokens,
    sample_requests,
)
from loom.bench.traffic import arrival_times
from loom.frontend.tokenizer import load_tokenizer

_WORDS = ("amber lantern quiet harbor silver meadow distant river hollow ember willow stone "
          "bright feather morning tide copper garden").split()


@pytest.fixture(scope="module")
def tokenizer(llama3_tokenizer_dir):
    return load_tokenizer(llama3_tokenizer_dir)


@pytest.fixture
def verse_file(tmp_path):
    """Made-up verse lines (no real text is shipped or used)."""
    rng = np.random.default_rng(7)
    lines = [" ".join(rng.choice(_WORDS, size=int(rng.integers(5, 10)))).capitalize() + ","
             for _ in range(300)]
    path = tmp_path / "verses.txt"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_random_prompts_have_the_requested_length(tokenizer):
    cfg = DatasetConfig("random", None, num_prompts=30, seed=3, random_input_len=200,
                        random_output_len=17, random_prefix_len=40)
    requests = sample_requests(cfg, tokenizer)
    assert len(requests) == 30 and all(r.expected_output_len == 17 for r in requests)
    for r in requests:
        assert r.prompt_len == count_tokens(tokenizer, r.prompt)
        assert abs(r.prompt_len - 240) <= 2
    prefix = requests[0].prompt[:60]
    assert all(r.prompt.startswith(prefix) for r in requests)
    assert len({r.prompt for r in requests}) == 30
    again = sample_requests(cfg, tokenizer)
    assert [r.prompt for r in again] == [r.prompt for r in requests]  # seeded


def test_random_range_ratio_spreads_the_lengths(tokenizer):
    """--random-range-ratio 0.5: input and output lengths uniform over 50..150% of the
    requested (vLLM's), each prompt as long as drawn; out of [0, 1) is refused."""
    cfg = DatasetConfig("random", None, num_prompts=60, seed=5, random_input_len=40,
                        random_output_len=20, random_range_ratio=0.5)
    requests = sample_requests(cfg, tokenizer)
    outs = [r.expected_output_len for r in requests]
    ins = [r.prompt_len for r in requests]
    assert min(outs) >= 10 and max(outs) <= 30 and len(set(outs)) > 8
    assert min(ins) >= 20 - 2 and max(ins) <= 60 + 2 and len(set(ins)) > 10
    assert abs(np.mean(outs) - 20) < 3 and abs(np.mean(ins) - 40) < 6
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="^random_range_ratio"):
            DatasetConfig("random", None, num_prompts=1, random_range_ratio=bad)


def test_sonnet_prompts_share_a_prefix_and_have_the_requested_length(tokenizer, verse_file):
    cfg = DatasetConfig("sonnet", verse_file, num_prompts=20, seed=1, sonnet_input_len=150,
                        sonnet_output_len=30, sonnet_prefix_len=50)
    requests = sample_requests(cfg, tokenizer)
    first_lines = open(verse_file).read().splitlines()[:2]
    for r in requests:
        assert r.prompt.startswith(SONNET_INSTRUCTION + "\n".join(first_lines))
        assert abs(r.prompt_len - 150) <= 2 and r.expected_output_len == 30
    assert len({r.prompt for r in requests}) > 15


def test_sonnet_needs_a_file_and_a_sane_prefix(tokenizer, verse_file):
    with pytest.raises(ValueError, match="dataset-path"):
        DatasetConfig("sonnet", None, num_prompts=1)
    with pytest.raises(ValueError, match="must exceed"):
        sample_requests(DatasetConfig("sonnet", verse_file, 1, sonnet_input_len=50,
                                      sonnet_prefix_len=60), tokenizer)


def test_sharegpt_prompts_and_reply_lengths(tokenizer, tmp_path):
    reply = "Here is a longer answer with quite a few words in it."
    data = [{"id": str(i), "conversations": [{"from": "human", "value": f"Question {i} about rivers?"},
                                             {"from": "gpt", "value": reply}]} for i in range(8)]
    data.append({"id": "short", "conversations": [{"from": "human", "value": "Hi"},
                                                  {"from": "gpt", "value": "Hello"}]})
    data.append({"id": "lonely", "conversations": [{"from": "human", "value": "only one turn"}]})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(data))
    requests = sample_requests(DatasetConfig("sharegpt", str(path), num_prompts=8), tokenizer)
    assert sorted(r.prompt for r in requests) == sorted(f"Question {i} about rivers?" for i in range(8))
    assert all(r.expected_output_len == count_tokens(tokenizer, reply) for r in requests)
    fixed = sample_requests(DatasetConfig("sharegpt", str(path), 3, sharegpt_output_len=9), tokenizer)
    assert [r.expected_output_len for r in fixed] == [9, 9, 9]
    with pytest.raises(ValueError, match="only 8 usable"):
        sample_requests(DatasetConfig("sharegpt", str(path), num_prompts=9), tokenizer)


def test_poisson_arrivals_have_the_right_mean():
    times = arrival_times(20000, rate=4.0, burstiness=1.0, rng=np.random.default_rng(0))
    gaps = np.diff(times)
    assert times[0] == 0.0 and np.all(gaps >= 0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.03)  # exponential gaps
    same = arrival_times(20000, rate=4.0, burstiness=1.0, rng=np.random.default_rng(0))
    assert np.array_equal(times, same)


def test_burstiness_keeps_the_mean_and_changes_the_spread():
    regular = np.diff(arrival_times(20000, 4.0, 4.0, np.random.default_rng(1)))
    bursty = np.diff(arrival_times(20000, 4.0, 0.25, np.random.default_rng(1)))
    assert regular.mean() == pytest.approx(0.25, rel=0.03) and bursty.mean() == pytest.approx(0.25, rel=0.1)
    assert regular.std() / regular.mean() == pytest.approx(0.5, rel=0.05)  # 1 / sqrt(shape)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)


def test_infinite_rate_sends_everything_at_once():
    assert np.array_equal(arrival_times(5, math.inf, 1.0, np.random.default_rng(0)), np.zeros(5))
    with pytest.raises(ValueError):
        arrival_times(5, 0.0, 1.0, np.random.default_rng(0))
