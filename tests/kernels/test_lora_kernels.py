"""The LoRA term's decode kernels (loom.kernels.lora) against the term computed in float64
from its definition: every slice of h = input A^T masked by the row's slot, times B, added
to y; the input as given, as silu(gate) * up, or as RMSNorm of the residual sum. And the
op (loom.lora.layers.lora_add): which rows take the kernels.

On the CPU the kernels run in Triton's interpreter; with CUDA the same checks run on the
GPU. Every check draws fresh inputs.
"""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")

from loom.kernels import lora as mod  # noqa: E402
from loom.kernels.interpreter import interpreted, patch_interpreter  # noqa: E402
from loom.lora import layers  # noqa: E402

DEVICE = "cpu" if interpreted(mod._shrink_kernel) else "cuda"
if DEVICE == "cpu":
    patch_interpreter()  # bfloat16 dot operands multiplied as values
_seed = iter(range(10_000))


def _case(m, k, n, slices, slots, rank, dtype, k_in=None):
    """y, x, a, b, mask and the norm weight; the mask's rows point at slot 0, slot 1, and
    (every third row) at no slot, as the manager writes them."""
    gen = torch.Generator().manual_seed(next(_seed))
    w = slices * slots * rank
    x = torch.randn(m, k_in or k, generator=gen)
    a = torch.randn(w, k, generator=gen) / k ** 0.5
    b = torch.randn(n, w, generator=gen) / w ** 0.5
    y = torch.randn(m, n, generator=gen)
    mask = torch.zeros(m + 3, slots * rank)  # longer than the step, as the manager's
    for row in range(m):
        if row % 3 != 2:
            slot = row % 2 % slots
            mask[row, slot * rank:(slot + 1) * rank] = 1
    norm_weight = 1 + 0.1 * torch.randn(k, generator=gen)
    return [t.to(dtype) for t in (y, x, a, b, mask, norm_weight)]


def _reference(y, x, a, b, mask, slices, norm_weight=None, eps=1e-6, silu_mul=False):
    y, x, a, b, mask = (t.double() for t in (y, x, a, b, mask))
    if silu_mul:
        gate, up = x.chunk(2, dim=-1)
        x = gate * torch.sigmoid(gate) * up
    if norm_weight is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.double()
    m = x.shape[0]
    h = (x @ a.T).view(m, slices, -1) * mask[:m].unsqueeze(1)
    return y + h.view(m, -1) @ b.T


def _run(args, **kwargs):
    y, x, a, b, mask = (t.to(DEVICE) for t in args)
    assert mod.supports(y, x, a, b, mask)
    y_before = y.clone()
    out = mod.lora_add(y, x, a, b, mask, **kwargs)
    assert torch.equal(y, y_before), "y is an input, never written"
    return out.cpu()


def _check(out, want, dtype):
    # float32: float32 sums. bfloat16: the input, h, the term and the sum each rounded
    # once to 8 bits of mantissa, as torch's own bfloat16 ops round them.
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    scale = want.abs().max().item()
    err = (out.double() - want).abs().max().item()
    assert err <= tol * scale, f"max error {err} against {scale}"


@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("k, slices", [(200, 1), (2304, 3)])  # one slice; 9 slices of K
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_input(m, k, slices, dtype):
    y, x, a, b, mask, _ = _case(m, k, 70, slices, 2, 8, dtype)
    out = _run((y, x, a, b, mask))
    _check(out, _reference(y, x, a, b, mask, slices), dtype)
    # a row pointing at no slot is y itself, bit for bit
    assert torch.equal(out[2::3], y[2::3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_input(dtype):
    """x = [gate | up]: the down projection's input made in the kernel."""
    y, x, a, b, mask, _ = _case(6, 160, 40, 1, 2, 8, dtype, k_in=320)
    out = _run((y, x, a, b, mask), silu_mul=True)
    _check(out, _reference(y, x, a, b, mask, 1, silu_mul=True), dtype)


@pytest.mark.parametrize("k", [96, 1536])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_input(k, dtype):
    """x = the residual sum: RMSNorm(x) * weight, each row's 1 / RMS over the whole row
    although its squares are summed per slice of K."""
    y, x, a, b, mask, nw = _case(4, k, 50, 2, 1, 8, dtype)
    x = x * 3
    out = _run((y, x, a, b, mask), norm_weight=nw.to(DEVICE), eps=1e-5)
    _check(out, _reference(y, x, a, b, mask, 2, norm_weight=nw, eps=1e-5), dtype)


def test_widest_h():
    """MAX_WIDTH columns of h (4 slots of rank 16 on q/k/v would be 192; 256 here)."""
    y, x, a, b, mask, _ = _case(3, 64, 48, 2, 8, 16, torch.float32)
    assert a.shape[0] == mod.MAX_WIDTH
    _check(_run((y, x, a, b, mask)), _reference(y, x, a, b, mask, 2), torch.float32)


def test_which_rows_take_the_kernels(monkeypatch):
    """The op: 1..16 rows of h at most MAX_WIDTH wide take the kernels; more rows, a
    wider h or a strided x take torch's ops, which compute the same term."""
    calls = []
    real = mod.lora_add
    monkeypatch.setattr(mod, "lora_add", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(layers, "_use_kernels", lambda x: True)
    cases = [(16, 1, 8, True), (17, 1, 8, False), (2, 1, 160, False)]
    for m, slices, rank, kernels in cases:
        y, x, a, b, mask, _ = _case(m, 48, 24, slices, 2, rank, torch.float32)
        calls.clear()
        out = layers.lora_add(y.to(DEVICE), x.to(DEVICE), a.to(DEVICE), b.to(DEVICE),
                              mask.to(DEVICE), slices)
        assert bool(calls) == kernels, (m, rank)
        _check(out.cpu(), _reference(y, x, a, b, mask, slices), torch.float32)
    y, x, a, b, mask, _ = _case(4, 48, 24, 1, 2, 8, torch.float32)
    wide = torch.cat([x, x], dim=1).to(DEVICE)[:, :48]  # rows 96 apart
    calls.clear()
    layers.lora_add(y.to(DEVICE), wide, a.to(DEVICE), b.to(DEVICE), mask.to(DEVICE), 1)
    assert not calls


_OFFLINE_COMPILE = r"""
from loom.kernels.lora import _expand_kernel, _shrink_kernel
types = {"x_ptr": "*bf16", "nw_ptr": "*bf16", "a_ptr": "*bf16", "part_ptr": "*fp32",
         "ss_ptr": "*fp32", "mask_ptr": "*bf16", "b_ptr": "*bf16", "y_ptr": "*bf16",
         "out_ptr": "*bf16", "eps": "fp32"}
shrink = dict(K=4096, ROWS=16, BLOCK_W=64, BLOCK_K=128, K_ITERS=2, DOT_PRECISION="tf32")
for mode in (0, 1, 2):
    ptx = build(_shrink_kernel, types, dict(shrink, MODE=mode), 4)
    print("shrink", mode, "mma.sync" in ptx or "wgmma" in ptx)
expand = dict(K=4096, SPLITS=16, ROWS=16, BLOCK_W=64, BLOCK_N=64, DOT_PRECISION="tf32")
for norm in (False, True):
    ptx = build(_expand_kernel, types, dict(expand, NORM=norm), 4)
    print("expand", int(norm), "mma.sync" in ptx or "wgmma" in ptx)
"""


def test_kernels_compile_for_sm90_offline():
    """Every variant compiles for the H200 with Triton's own ptxas (no GPU here), its
    products on the tensor cores."""
    from tests.triton_interpreter import SM90_BUILD, compile_for_sm90_offline
    out = compile_for_sm90_offline(SM90_BUILD + _OFFLINE_COMPILE).splitlines()
    assert out == ["shrink 0 True", "shrink 1 True", "shrink 2 True", "expand 0 True",
                   "expand 1 True"], out
