"""The sampling kernels against torch: greedy exactly, random by its distribution."""

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels.sampling import sample_rows  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("vocab, chunk", [(1000, 64), (64, 64), (7, 64), (300, 128)])
def test_greedy_equals_torch_argmax_ties_included(vocab, chunk):
    gen = torch.Generator().manual_seed(vocab)
    # Small integers: many ties, which must go to the lowest index like torch.argmax.
    logits = torch.randint(-3, 4, (6, vocab), generator=gen).float()
    logits[1] = 0.0  # a whole row of ties
    logits[2, -1] = 100.0  # the winner in the last, partial chunk
    logits[3, :] = float("-inf")
    logits[3, vocab // 2] = 1.0
    logits = logits.to(DEVICE)
    got = sample_rows(logits, chunk=chunk)
    assert got.dtype == torch.long
    assert torch.equal(got.cpu(), logits.cpu().argmax(dim=-1))


def test_a_strided_row_view_and_bf16():
    logits = torch.randn(4, 200, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    wide = torch.zeros(4, 256, device=DEVICE)
    wide[:, :200] = logits
    view = wide[:, :200]
    assert torch.equal(sample_rows(view, chunk=64).cpu(), logits.argmax(-1).cpu())
    half = logits.bfloat16()
    assert torch.equal(sample_rows(half, chunk=64).cpu(), half.float().argmax(-1).cpu())


def _chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's goodness-of-fit p-value: the chi-square survival function at the statistic,
    via the regularised upper incomplete gamma function."""
    expected = probs / probs.sum() * counts.sum()
    stat = float(((counts - expected) ** 2 / expected).sum())
    dof = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


# Triton's interpreter spends ~25 ms per program on Philox: sample counts stay small on
# CPU (one row per program), large enough for a 1e-3 goodness-of-fit test.
ROWS = 2000 if torch.cuda.is_available() else 360


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_random_rows_draw_from_the_tempered_softmax(temperature):
    base = torch.tensor([1.5, 1.0, 0.5, 0.0, -0.5, float("-inf"), 0.8])
    logits = base.repeat(ROWS, 1).to(DEVICE)
    temp = torch.full((ROWS,), temperature, device=DEVICE)
    tokens = sample_rows(logits, temp, seed=1234, chunk=16).cpu().numpy()
    counts = np.bincount(tokens, minlength=len(base))
    assert counts[5] == 0  # a -inf logit is never drawn
    probs = torch.softmax(base / temperature, dim=0).numpy()
    keep = probs > 0
    assert _chi_square_p(counts[keep], probs[keep]) > 1e-3
    # The same seed draws the same tokens; another seed, others.
    few = slice(0, 24)
    again = sample_rows(logits[few], temp[few], seed=1234, chunk=16).cpu().numpy()
    other = sample_rows(logits[few], temp[few], seed=4321, chunk=16).cpu().numpy()
    assert np.array_equal(tokens[few], again) and not np.array_equal(tokens[few], other)


def test_rows_split_over_chunks_sample_the_whole_row():
    vocab = 40
    rows = ROWS * 2 // 3  # each takes three chunks: the interpreter's cost is per chunk
    base = torch.linspace(1.0, -1.0, vocab)
    logits = base.repeat(rows, 1).to(DEVICE)
    tokens = sample_rows(logits, torch.ones(rows, device=DEVICE), seed=7, chunk=16)
    counts = np.bincount(tokens.cpu().numpy(), minlength=vocab)
    # Pooled into 4 bins of 10 tokens, each spanning a chunk boundary (chunks of 16).
    pooled = counts.reshape(4, 10).sum(1)
    probs = torch.softmax(base, 0).numpy().reshape(4, 10).sum(1)
    assert _chi_square_p(pooled, probs) > 1e-3


def test_greedy_rows_in_a_random_batch_take_the_argmax():
    logits = torch.randn(24, 40, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    greedy = torch.zeros(24, dtype=torch.bool)
    greedy[::2] = True
    temp = torch.full((24,), 1.0, device=DEVICE)
    got = sample_rows(logits, temp, greedy.to(DEVICE), seed=5, chunk=16).cpu()
    argmax = logits.argmax(-1).cpu()
    assert torch.equal(got[::2], argmax[::2])
    assert not torch.equal(got[1::2], argmax[1::2])  # 12 random rows, not all the argmax


def test_bad_input_is_a_value_error():
    with pytest.raises(ValueError, match="2-D row-contiguous"):
        sample_rows(torch.zeros(3, 4, device=DEVICE).t())
