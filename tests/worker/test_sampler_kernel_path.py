"""Which batches the Sampler sends to loom's sampling kernel, and that what the sampler
applies before it (min_tokens masking, greedy rows) still holds there. The kernel runs in
Triton's interpreter on CPU; its distribution is tested in tests/kernels."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels import sampling as kernel  # noqa: E402
from loom.sampling_params import SamplingParams  # noqa: E402
from loom.worker import sampler as sampler_module  # noqa: E402
from loom.worker.sampler import Sampler, SamplingMetadata, greedy_argmax  # noqa: E402

VOCAB = 48
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def kernel_calls(monkeypatch):
    """Take the kernel path on any device, and count its calls."""
    calls = []
    real = kernel.sample_rows

    def spy(logits, temperature=None, greedy_mask=None, seed=0, chunk=kernel.CHUNK):
        calls.append(temperature is not None)
        return real(logits, temperature, greedy_mask, seed, chunk=16)
    monkeypatch.setattr(kernel, "sample_rows", spy)
    monkeypatch.setattr(sampler_module, "_kernel_applies", lambda logits: True)
    return calls


def _run(params, logits, stops=None, seeds=None, outputs=None):
    n = len(params)
    md = SamplingMetadata.build(params, outputs or [[] for _ in range(n)],
                                [[0] for _ in range(n)], stops or [set() for _ in range(n)],
                                seeds or [p.seed for p in params], DEVICE, VOCAB)
    return Sampler()(logits.clone().to(DEVICE), md).sampled_token_ids.cpu()


def test_temperature_only_batches_take_the_kernel(kernel_calls):
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8),
              SamplingParams(temperature=0.0), SamplingParams(temperature=1.3)]
    tokens = _run(params, logits)
    assert kernel_calls == [True]
    assert tokens[0] == logits[0].argmax() and tokens[2] == logits[2].argmax()
    _run([SamplingParams(temperature=0.0)] * 2, logits[:2])
    assert kernel_calls == [True, False]  # all greedy: the argmax form


@pytest.mark.parametrize("params, seeds", [
    ([SamplingParams(temperature=1.0, top_p=0.9)], None),
    ([SamplingParams(temperature=1.0, top_k=5)], None),
    ([SamplingParams(temperature=1.0, min_p=0.1)], None),
    ([SamplingParams(temperature=1.0, seed=3)], [3]),
])
def test_filters_and_seeded_rows_keep_the_torch_path(kernel_calls, params, seeds):
    _run(params, torch.randn(1, VOCAB), seeds=seeds)
    assert kernel_calls == []


def test_min_tokens_masking_holds_on_the_kernel_path(kernel_calls):
    # Stop token 7 has by far the largest logit; under min_tokens it must never be drawn.
    logits = torch.zeros(16, VOCAB)
    logits[:, 7] = 30.0
    params = [SamplingParams(temperature=1.0, min_tokens=5)] * 16
    tokens = _run(params, logits, stops=[{7}] * 16)
    assert kernel_calls == [True]
    assert 7 not in tokens.tolist()


def test_greedy_argmax_off_cuda_is_torch(monkeypatch):
    logits = torch.randn(3, VOCAB)
    assert torch.equal(greedy_argmax(logits), logits.argmax(-1))
