"""The norm decomposition pass: fused add + RMSNorm nodes become aten ops for Inductor,
unless LOOM_TRITON_ADD_NORM=1 keeps them as loom's op (its Triton kernel on CUDA)."""

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from loom.compilation.passes.graph_utils import FUSED_ADD_RMS_NORM, op_name
from loom.compilation.passes.norm_decomposition import NormDecompositionPass
from loom.layers import norm  # noqa: F401  (registers the loom ops)


def _graph():
    def f(x, r, w):
        return torch.ops.loom.fused_add_rms_norm(x, r, w, 1e-6)
    args = (torch.randn(3, 64), torch.randn(3, 64), torch.randn(64))
    return make_fx(f, tracing_mode="fake")(*args)


def _fused_nodes(gm):
    return sum(op_name(n) == FUSED_ADD_RMS_NORM for n in gm.graph.nodes)


def test_decomposes_by_default_and_keeps_with_triton_add_norm(monkeypatch):
    monkeypatch.delenv("LOOM_TRITON_ADD_NORM", raising=False)
    gm = _graph()
    assert _fused_nodes(gm) == 1
    default_key = NormDecompositionPass().cache_state()
    assert NormDecompositionPass()(gm.graph) == 1
    assert _fused_nodes(gm) == 0
    x, r, w = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64)
    gm.recompile()
    out, res = gm(x, r, w)
    want_out, want_res = norm.fused_add_rms_norm(x, r, w, 1e-6)
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(res, want_res)

    monkeypatch.setenv("LOOM_TRITON_ADD_NORM", "1")
    gm = _graph()
    assert NormDecompositionPass()(gm.graph) == 0
    assert _fused_nodes(gm) == 1
    # Inductor's cache must not hand one setting's compiled graph to the other
    assert NormDecompositionPass().cache_state() != default_key
