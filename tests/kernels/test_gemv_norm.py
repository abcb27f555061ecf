"""The GEMV that applies the residual add + RMSNorm to its input itself
(loom.kernels.gemv.add_rms_norm_gemv) against loom's norm then the product, on tiny shapes
(Triton's interpreter on the CPU, as test_gemv_kernel.py) and, on a GPU, at each shipped
gemv_norm config's real shape."""

import pytest
import torch

# First: it picks the interpreter (TRITON_INTERPRET) before anything imports Triton, and
# patches it (bfloat16 dots).
from tests.kernels.test_gemv_kernel import CONFIGS, DEVICE, INTERPRET, make, rel_err

from loom.kernels.gemv import GemvConfig  # noqa: E402


def _add_norm_case(m, k, dtype, seed):
    x, w = make(m, 48, k, dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    residual = torch.randn(m, k, generator=gen).to(dtype).to(DEVICE)
    norm_w = (1 + 0.1 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
    return x, residual, norm_w, w


@pytest.mark.parametrize("cfg", [c for c in CONFIGS if c.split_k == 1] + [None],
                         ids=lambda c: c.describe().replace(" ", "_") if c else "default")
@pytest.mark.parametrize("m, k", [(1, 64), (3, 64), (5, 80)])
def test_add_rms_norm_input_is_the_reference_norm(cfg, m, k):
    """add_rms_norm_gemv = loom's fused_add_rms_norm, then the product, in float32 (row
    reductions over one chunk, several, a masked one; the dot; the default config with its
    split taken off); the new residual is x + residual, bit for bit."""
    from loom.kernels.gemv import add_rms_norm_gemv
    from loom.layers.norm import fused_add_rms_norm
    x, residual, norm_w, w = _add_norm_case(m, k, torch.float32, seed=30 + m)
    normed, ref_res = fused_add_rms_norm(x.cpu(), residual.cpu(), norm_w.cpu(), 1e-5)
    y, res_out = add_rms_norm_gemv(x, residual, norm_w, 1e-5, w, config=cfg)
    assert y.shape == (m, 48) and res_out.shape == (m, k)
    torch.testing.assert_close(res_out.cpu(), ref_res, rtol=0, atol=0)
    norm, worst = rel_err(y, normed.double() @ w.cpu().double().T)
    assert norm < 1e-5 and worst < 1e-5, (norm, worst)


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2]],
                         ids=lambda c: c.describe().replace(" ", "_"))
def test_add_rms_norm_input_bfloat16(cfg):
    """In bfloat16 the input is rounded where the reference rounds it (x + residual, the
    normalised value, its product with the weight): within bfloat16 rounding of the
    reference's product (the interpreter truncates where torch rounds)."""
    from loom.kernels.gemv import add_rms_norm_gemv
    from loom.layers.norm import fused_add_rms_norm
    x, residual, norm_w, w = _add_norm_case(2, 64, torch.bfloat16, seed=40)
    normed, ref_res = fused_add_rms_norm(x.cpu(), residual.cpu(), norm_w.cpu(), 1e-6)
    y, res_out = add_rms_norm_gemv(x, residual, norm_w, 1e-6, w, config=cfg)
    assert y.dtype == res_out.dtype == torch.bfloat16
    assert rel_err(res_out, ref_res)[1] < 1e-2
    norm, worst = rel_err(y, normed.double() @ w.cpu().double().T)
    assert norm < 1.5e-2 and worst < 3e-2, (norm, worst)


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2]],
                         ids=lambda c: c.describe().replace(" ", "_"))
def test_add_rms_norm_input_fp8_weight(cfg):
    """With an fp8 weight and its scale per row, the sums are scaled by both the rows'
    1 / RMS and the weight rows' scales: the reference norm times the dequantized weight."""
    from loom.kernels.gemv import add_rms_norm_gemv
    from loom.layers.norm import fused_add_rms_norm
    from tests.kernels.test_gemv_kernel import _fp8
    x, residual, norm_w, w = _add_norm_case(3, 80, torch.float32, seed=50)
    q, scale, w_ref = _fp8(w)
    normed, _ = fused_add_rms_norm(x.cpu(), residual.cpu(), norm_w.cpu(), 1e-5)
    y, _ = add_rms_norm_gemv(x, residual, norm_w, 1e-5, q, weight_scale=scale, config=cfg)
    norm, worst = rel_err(y, normed.double() @ w_ref.cpu().T)
    assert norm < 1e-5 and worst < 1e-5, (norm, worst)


def _shipped_norm_configs():
    """(N, K, M, config) of the gemv_norm table shipped for this GPU; none on the CPU."""
    if INTERPRET:
        return []
    from loom.kernels.gemv_decode import _table
    from loom.kernels.tuned import device_name
    table = _table(torch.bfloat16, device_name(torch.device("cuda")), "gemv_norm")
    return [(n, k, m, cfg) for (n, k), per_m in table.items() for m, cfg in per_m.items()
            if cfg is not None]


@pytest.mark.gpu
@pytest.mark.skipif(not _shipped_norm_configs(), reason="no gemv_norm table for this device")
@pytest.mark.parametrize("n, k, m, cfg", _shipped_norm_configs(),
                         ids=lambda v: v.describe().replace(" ", "_")
                         if isinstance(v, GemvConfig) else str(v))
def test_shipped_norm_configs_at_their_real_shapes(n, k, m, cfg):
    """Each config the decode path fuses the norm with, at its model's real weight shape:
    float32 against the reference norm then product in float64, and bfloat16 (the dtype
    it was measured in) within bfloat16 rounding of it."""
    from loom.kernels.gemv import add_rms_norm_gemv
    from loom.layers.norm import fused_add_rms_norm
    gen = torch.Generator().manual_seed(n + m)
    x, residual = torch.randn(m, k, generator=gen), torch.randn(m, k, generator=gen)
    norm_w, w = 1 + 0.1 * torch.randn(k, generator=gen), torch.randn(n, k, generator=gen)
    w /= k ** 0.5
    normed, ref_res = fused_add_rms_norm(x.double(), residual.double(), norm_w.double(), 1e-5)
    ref = normed @ w.double().T
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 1.5e-2)):
        args = [t.to(dtype).to(DEVICE) for t in (x, residual, norm_w)]
        y, res_out = add_rms_norm_gemv(*args, 1e-5, w.to(dtype).to(DEVICE), config=cfg)
        assert rel_err(y, ref)[0] < tol, (dtype, rel_err(y, ref))
        assert rel_err(res_out, ref_res)[1] < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("case, match", [
    ("residual_shape", "residual must be contiguous and match x"),
    ("residual_dtype", "residual must be contiguous and match x"),
    ("norm_weight_shape", r"norm_weight must be a contiguous \[64\]"),
    ("split_k", "must not split K"),
])
def test_add_rms_norm_value_errors(case, match):
    from loom.kernels.gemv import add_rms_norm_gemv
    x, residual, norm_w, w = _add_norm_case(2, 64, torch.float32, seed=1)
    if case == "residual_shape":
        residual = residual[:1]
    elif case == "residual_dtype":
        residual = residual.double()
    elif case == "norm_weight_shape":
        norm_w = norm_w[:32]
    with pytest.raises(ValueError, match=match):
        add_rms_norm_gemv(x, residual, norm_w, 1e-6, w,
                          config=CONFIGS[3] if case == "split_k" else None)
