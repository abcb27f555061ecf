"""loom's single-token GEMV kernel against F.linear, alone and inside a model's decode."""

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom import LLM, SamplingParams  # noqa: E402
from loom.kernels.gemv import gemv  # noqa: E402
from loom.layers import linear as linear_module  # noqa: E402
from tests.conftest import hf_greedy  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("n, k, block_n, block_k", [
    (100, 64, 16, 64),     # N not a multiple of the tile
    (37, 200, 8, 64),      # K not a multiple of the tile either
    (64, 128, 64, 128),    # one program
])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_equals_linear_fp32(n, k, block_n, block_k, bias):
    gen = torch.Generator().manual_seed(n * k)
    x = torch.randn(1, k, generator=gen).to(DEVICE)
    w = torch.randn(n, k, generator=gen).to(DEVICE)
    b = torch.randn(n, generator=gen).to(DEVICE) if bias else None
    out = torch.full((1, n), float("nan"), device=DEVICE)
    out = gemv(x, w, b, block_n=block_n, block_k=block_k)
    torch.testing.assert_close(out, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_gemv_bf16_and_a_strided_input():
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(1, 256, generator=gen).bfloat16().to(DEVICE)
    x = wide[:, :128]  # a column slice: contiguous rows of a wider tensor
    w = torch.randn(48, 128, generator=gen).bfloat16().to(DEVICE)
    out = gemv(x, w, block_n=16, block_k=64)
    assert out.dtype == torch.bfloat16
    ref = F.linear(x.float(), w.float())
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


def test_bad_shapes_are_value_errors():
    with pytest.raises(ValueError, match=r"x \[1, K\]"):
        gemv(torch.zeros(2, 4), torch.zeros(3, 4))
    with pytest.raises(ValueError, match="contiguous"):
        gemv(torch.zeros(1, 4), torch.zeros(4, 3).t())


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="forces the kernel onto CPU tensors, which needs the interpreter")
@pytest.mark.parametrize("level", [0, 3])
def test_single_token_decode_through_gemv_matches_transformers(level, tiny_model_factory,
                                                               monkeypatch):
    """Decode steps of one request take the GEMV op (forced on CPU here); the greedy tokens
    still equal transformers'. At level 3 only the one-token graph holds the op."""
    path, hf = tiny_model_factory("llama")
    monkeypatch.setattr(linear_module, "use_gemv",
                        lambda x, w: x.dim() == 2 and isinstance(x.shape[0], int)
                        and x.shape[0] == 1)
    import loom.kernels.gemv as kernel_module
    calls, real_kernel = [], kernel_module.gemv

    def counting(x, weight, bias=None, **kw):
        calls.append(x.shape[0])
        return real_kernel(x, weight, bias, **kw)
    monkeypatch.setattr(kernel_module, "gemv", counting)
    llm = LLM(path, skip_tokenizer_init=True, dtype="float32", device="cpu",
              max_model_len=128, compilation_config=level)
    prompt = [5, 17, 33, 3, 48, 9, 11]
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    out = llm.generate([prompt], params, use_tqdm=False)[0]
    assert out.outputs[0].token_ids == hf_greedy(hf, prompt, 6)
    assert calls, "no decode step reached the GEMV kernel"
    assert set(calls) == {1}  # the 7-token prefill kept F.linear


def test_the_gate_traces_without_a_graph_break_or_a_guard_on_the_token_count():
    """use_gemv runs inside Dynamo's trace of every linear layer: fullgraph must hold, and
    a dynamic token count must not be specialised by it (one graph for 2 and 5 tokens)."""
    counts = {"frames": 0}

    def backend(gm, example_inputs):
        counts["frames"] += 1
        return gm.forward

    w = torch.randn(8, 4)

    @torch.compile(backend=backend, fullgraph=True, dynamic=True)
    def f(x):
        return linear_module.linear(x, w)

    for n in (2, 5):
        x = torch.randn(n, 4)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(f(x), F.linear(x, w))
    assert counts["frames"] == 1
