"""The one-kernel softmax top-k routing against loom.layers.moe.route (torch's softmax and
topk) on random router logits; Triton's interpreter on the CPU, compiled on CUDA."""

import os

import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest  # noqa: E402

pytest.importorskip("triton")
from loom.kernels.moe_route import route_topk  # noqa: E402
from loom.layers.moe import route  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("tokens, experts, top_k", [
    (1, 128, 8),    # Qwen3-30B-A3B at batch-1 decode
    (37, 128, 8),
    (5, 60, 6),     # neither a power of two
    (4, 8, 2),      # Mixtral's routing
    (3, 16, 16),    # every expert
])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_route_topk_matches_torch(tokens, experts, top_k, renormalize, dtype):
    logits = (torch.randn(tokens, experts, device=DEVICE) * 3).to(dtype)
    weights, ids = route_topk(logits, top_k, renormalize)
    want_weights, want_ids = route(logits, top_k, renormalize)
    assert ids.dtype == want_ids.dtype and weights.dtype == want_weights.dtype
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    if dtype == torch.float32:  # no ties: the same experts in the same order
        assert torch.equal(ids, want_ids)
    else:
        # bf16 logits repeat, and torch orders equal ones its own way: each chosen expert's
        # probability must be the one torch ranks in that place
        probs = torch.softmax(logits.float(), dim=-1)
        assert all(len(set(row)) == top_k for row in ids.tolist())
        torch.testing.assert_close(probs.gather(1, ids), probs.topk(top_k, dim=-1).values,
                                   atol=0, rtol=0)


def test_route_topk_reads_a_strided_view_and_breaks_ties_low():
    # the router's logits as a column slice of a wider tensor; a row of equal logits
    wide = torch.randn(3, 40, device=DEVICE)
    wide[1] = 0.5
    weights, ids = route_topk(wide[:, 4:36], 4, True)
    want_weights, want_ids = route(wide[:, 4:36], 4, True)
    torch.testing.assert_close(weights, want_weights, atol=1e-6, rtol=1e-5)
    assert torch.equal(ids[[0, 2]], want_ids[[0, 2]])
    assert ids[1].tolist() == [0, 1, 2, 3]  # the lowest index wins a tie
    assert weights[1].tolist() == [0.25] * 4


def test_route_topk_bad_top_k():
    with pytest.raises(ValueError, match="top_k must be in 1..8"):
        route_topk(torch.randn(2, 8, device=DEVICE), 9, True)
