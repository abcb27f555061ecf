"""The small-M GEMV kernel (loom.kernels.gemv) against torch on tiny shapes.

On the CPU it runs in Triton's interpreter (TRITON_INTERPRET=1): float32 results match a
float64 reference to float32 rounding, whichever way K is cut (row reductions, tensor-core
dot, the three split-K sums); bfloat16 ones to bfloat16 rounding. The interpreter rounds
float32 -> bfloat16 by truncation where torch and the GPU round to nearest, hence the
looser bfloat16 tolerances. With CUDA the same checks run on the compiled kernel.
"""

import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
triton = pytest.importorskip("triton")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from loom.kernels import arrival  # noqa: E402
from loom.kernels import gemv as gemv_mod  # noqa: E402
from loom.kernels.gemv import GemvConfig, gemv  # noqa: E402
from loom.kernels.interpreter import patch_interpreter  # noqa: E402

INTERPRET = isinstance(gemv_mod._gemv_kernel, InterpretedFunction)
DEVICE = "cpu" if INTERPRET else "cuda"
if INTERPRET:
    patch_interpreter()  # bfloat16 dot operands multiplied as values

# One of each code path: row reductions (one chunk, several, a partial one), the dot, and
# every split mode with each product.
CONFIGS = [
    GemvConfig(block_n=16, block_k=32),
    GemvConfig(block_n=32, block_k=128, num_stages=1),  # one chunk wider than K: masked
    GemvConfig(block_n=16, block_k=16, use_dot=True),
    GemvConfig(block_n=16, block_k=16, split_k=2, split_mode="fixup"),
    GemvConfig(block_n=32, block_k=16, split_k=4, split_mode="fixup", use_dot=True),
    GemvConfig(block_n=16, block_k=16, split_k=4, split_mode="reduce"),
    GemvConfig(block_n=16, block_k=32, split_k=2, split_mode="atomic", use_dot=True),
]


def make(m, n, k, dtype, silu=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 2 * k if silu else k, generator=gen)
    w = torch.randn(n, k, generator=gen) / k ** 0.5
    return x.to(dtype).to(DEVICE), w.to(dtype).to(DEVICE)


def rel_err(y, ref):
    y, ref = y.double().cpu(), ref.double().cpu()
    assert torch.isfinite(y).all()
    return ((y - ref).norm() / ref.norm()).item(), ((y - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.describe().replace(" ", "_"))
@pytest.mark.parametrize("m", [1, 3])
def test_float32_matches_reference(cfg, m):
    x, w = make(m, 48, 64, torch.float32, seed=m)
    y = gemv(x, w, config=cfg)
    assert y.shape == (m, 48) and y.dtype == torch.float32
    norm, worst = rel_err(y, x.double() @ w.double().T)
    assert norm < 1e-5 and worst < 1e-5, (norm, worst)


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2], CONFIGS[3], CONFIGS[5]],
                         ids=lambda c: c.describe().replace(" ", "_"))
def test_uneven_n_and_k(cfg):
    """N not a multiple of block_n (clamped loads, masked stores), K not a multiple of
    the chunk (masked chunk tail; with split_k=4 of 16-wide chunks the last slice lies
    wholly past K=80), M = 5 and 11 (padded to 8 or 16, and 16)."""
    for m in (5, 11):
        x, w = make(m, 40, 80, torch.float32, seed=7 + m)
        y = gemv(x, w, config=cfg)
        norm, worst = rel_err(y, x.double() @ w.double().T)
        assert norm < 1e-5 and worst < 1e-5, (m, norm, worst)


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2], CONFIGS[4], CONFIGS[5]],
                         ids=lambda c: c.describe().replace(" ", "_"))
@pytest.mark.parametrize("m", [1, 3, 16])
def test_bfloat16_matches_linear(cfg, m):
    x, w = make(m, 48, 64, torch.bfloat16, seed=10 + m)
    y = gemv(x, w, config=cfg)
    assert y.dtype == torch.bfloat16
    # Float32 accumulation of the same bfloat16 products; only y's rounding differs.
    norm, worst = rel_err(y, x.double() @ w.double().T)
    assert norm < 1e-2 and worst < 2e-2, (norm, worst)


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[2], CONFIGS[3], CONFIGS[6]],
                         ids=lambda c: c.describe().replace(" ", "_"))
@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_input(cfg, m, dtype):
    """x = [gate | up]: the product is silu(gate) * up @ W^T, as torch computes it."""
    x, w = make(m, 48, 64, dtype, silu=True, seed=20 + m)
    g, u = x[:, :64], x[:, 64:]
    act = F.silu(g) * u
    y = gemv(x, w, silu_mul_input=True, config=cfg)
    assert y.shape == (m, 48) and y.dtype == dtype
    norm, worst = rel_err(y, act.double() @ w.double().T)
    if dtype == torch.float32:
        assert norm < 1e-5 and worst < 1e-5, (norm, worst)
    else:  # silu's exp, and truncation against rounding, may move act by a bf16 ulp
        assert norm < 1.5e-2 and worst < 3e-2, (norm, worst)
        assert rel_err(y, F.linear(act, w).float())[0] < 1.5e-2


def _fp8(w):
    """w -> float8_e4m3fn with a float32 scale per row, and what the two make in float64."""
    scale = w.abs().amax(dim=1, keepdim=True).float() / 448
    q = (w.float() / scale).to(torch.float8_e4m3fn)
    return q, scale, q.double() * scale.double()


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.describe().replace(" ", "_"))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("silu", [False, True], ids=["plain", "silu"])
def test_fp8_weight_scaled_per_row(cfg, dtype, silu):
    """An fp8 weight with a float32 scale per row (W8A16): the sums of x times the fp8
    values, times each row's scale; against the dequantized weight in float64. N and K
    uneven (masked tails), M 1 and 5; the scale given as [N, 1] (the layers' shape) and
    as [N]."""
    for m, shape in ((1, (40, 1)), (5, (40,))):
        x, w = make(m, 40, 80, torch.float32, silu=silu, seed=30 + m)
        q, scale, w_ref = _fp8(w)
        x = x.to(dtype)
        act = F.silu(x[:, :80]) * x[:, 80:] if silu else x
        y = gemv(x, q, weight_scale=scale.reshape(shape), silu_mul_input=silu, config=cfg)
        assert y.shape == (m, 40) and y.dtype == dtype
        norm, worst = rel_err(y, act.double() @ w_ref.T)
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        assert norm < tol and worst < tol, (m, norm, worst)
        # and the scale matters: without it the sums are of the raw fp8 values
        assert rel_err(y, act.double() @ q.double().T)[0] > 0.5


def test_fixup_counters_reset_between_calls():
    """The last program of each row block resets its counter: a second call (and one with
    another split) must see zeros and still be right."""
    x, w = make(2, 48, 64, torch.float32, seed=3)
    ref = x.double() @ w.double().T
    for cfg in (CONFIGS[3], CONFIGS[3], CONFIGS[4]):
        assert rel_err(gemv(x, w, config=cfg), ref)[1] < 1e-5
    assert int(arrival._BUFFERS[(x.device, "gemv")].abs().sum()) == 0


def test_default_config_and_dict_config():
    x, w = make(1, 48, 64, torch.float32, seed=4)
    ref = x.double() @ w.double().T
    assert rel_err(gemv(x, w), ref)[1] < 1e-5
    assert rel_err(gemv(x, w, config={"block_n": 16, "block_k": 32, "split_k": 2}), ref)[1] \
        < 1e-5
    cfg = gemv_mod.default_config(1, 3072, 4096)
    assert cfg.split_k > 1 and 3072 // cfg.block_n * cfg.split_k >= 264


@pytest.mark.parametrize("case, match", [
    ("x_3d", "expected x"),
    ("m_zero", "1 to 16 rows"),
    ("m_seventeen", "1 to 16 rows"),
    ("k_mismatch", "columns, expected 64"),
    ("silu_not_doubled", r"expected 2 \* 64"),
    ("dtype_mismatch", "share a dtype"),
    ("int_dtype", "share a dtype"),
    ("fp8_without_scale", "share a dtype"),
    ("scale_per_tensor", "one per row"),
    ("x_strided", "contiguous"),
    ("w_strided", "contiguous"),
    ("block_not_pow2", "powers of two"),
    ("dot_small_block", "use_dot needs"),
    ("bad_split_mode", "split_mode must be"),
    ("split_zero", "split_k must be"),
    ("split_over_k", "exceeds K"),
])
def test_value_errors(case, match):
    x, w = make(2, 48, 64, torch.float32)
    kwargs = {}
    if case == "x_3d":
        x = x[None]
    elif case == "m_zero":
        x = x[:0]
    elif case == "m_seventeen":
        x = torch.randn(17, 64, device=DEVICE)
    elif case == "k_mismatch":
        x = torch.randn(2, 32, device=DEVICE)
    elif case == "silu_not_doubled":
        kwargs["silu_mul_input"] = True
    elif case == "dtype_mismatch":
        w = w.to(torch.bfloat16)
    elif case == "int_dtype":
        x, w = x.to(torch.int32), w.to(torch.int32)
    elif case == "fp8_without_scale":
        w = w.to(torch.float8_e4m3fn)
    elif case == "scale_per_tensor":
        w = w.to(torch.float8_e4m3fn)
        kwargs["weight_scale"] = torch.ones(1, device=DEVICE)
    elif case == "x_strided":
        x = torch.randn(64, 2, device=DEVICE).t()
    elif case == "w_strided":
        w = torch.randn(64, 48, device=DEVICE).t()
    elif case == "block_not_pow2":
        kwargs["config"] = GemvConfig(block_n=24)
    elif case == "dot_small_block":
        kwargs["config"] = GemvConfig(block_n=8, use_dot=True)
    elif case == "bad_split_mode":
        kwargs["config"] = GemvConfig(split_k=2, split_mode="tree")
    elif case == "split_zero":
        kwargs["config"] = GemvConfig(split_k=0)
    elif case == "split_over_k":
        kwargs["config"] = GemvConfig(block_k=16, split_k=65)
    with pytest.raises(ValueError, match=match):
        gemv(x, w, **kwargs)


_OFFLINE_COMPILE = r"""
import os, sys
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.gemv import _gemv_kernel
names = list(_gemv_kernel.arg_names)
pointers = {"x_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16", "part_ptr": "*fp32",
            "count_ptr": "*i32", "res_ptr": "*bf16", "nw_ptr": "*bf16", "res_out_ptr": "*bf16"}
for cons, warps, stages in [
        # row reductions, pipelined, 4-way split with the one-launch fixup (decode's qkv)
        (dict(M=1, K=4096, BLOCK_N=16, BLOCK_K=512, SPLIT_K=4, SPLIT_MODE=1, USE_DOT=False,
              SILU_MUL=False), 4, 3),
        # the fused SwiGLU down projection on the tensor cores, reduced by a second kernel
        (dict(M=4, K=7168, BLOCK_N=32, BLOCK_K=128, SPLIT_K=2, SPLIT_MODE=2, USE_DOT=True,
              SILU_MUL=True), 4, 4),
        # the residual add + RMSNorm read with the input (decode's qkv and gate_up)
        (dict(M=1, K=4096, BLOCK_N=8, BLOCK_K=1024, SPLIT_K=1, SPLIT_MODE=0, USE_DOT=False,
              SILU_MUL=False, ADD_NORM=True), 4, 3),
        (dict(M=4, K=4096, BLOCK_N=64, BLOCK_K=128, SPLIT_K=1, SPLIT_MODE=0, USE_DOT=True,
              SILU_MUL=False, ADD_NORM=True), 4, 4)]:
    cons.update(EVEN_N=True, DOT_PRECISION="tf32", NUM_STAGES=stages)
    sig = dict(pointers, eps="fp32", N="i32", **{k: "constexpr" for k in cons})
    src = ASTSource(fn=_gemv_kernel, signature=sig,
                    constexprs={(names.index(k),): v for k, v in cons.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i in range(6)})
    kernel = tcompile(src, target=GPUTarget("cuda", 90, 32),
                      options=dict(num_warps=warps, num_stages=stages))
    assert kernel.asm["cubin"], "no cubin"
    ptx = kernel.asm["ptx"]
    assert "cp.async" in ptx, "the chunk loop was not pipelined"
    print("ok", cons["M"], cons["USE_DOT"], len(kernel.asm["cubin"]))
"""


def test_compiles_for_sm90_offline():
    """The compiled path, which the interpreter never exercises, builds for Hopper with
    Triton's bundled ptxas (no GPU needed); its K loop is software-pipelined."""
    from tests.triton_interpreter import compile_for_sm90_offline
    assert compile_for_sm90_offline(_OFFLINE_COMPILE).count("ok") == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_silu_mul_kernel_rounds_as_torch_eager(dtype):
    """Past the GEMV's rows the down projection's activation is one kernel: silu(gate) * up
    as torch's two eager ops round it (K not a multiple of the 1024-wide block: masked)."""
    from loom.kernels.silu_mul import silu_mul
    x = (torch.randn(3, 2 * 1100, device=DEVICE) * 4).to(dtype)
    gate, up = x.split(1100, dim=-1)
    ref = F.silu(gate.cpu().float()).to(dtype).float() * up.cpu().float()
    out = silu_mul(x)
    assert out.shape == (3, 1100) and out.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.cpu().float(), ref.to(dtype).float(), atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="silu_mul: x must be"):
        silu_mul(x[:, :-1])


@pytest.mark.skipif(not INTERPRET, reason="counts the interpreter's launches")
@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[5]], ids=lambda c: c.describe())
def test_compile_only_launches_nothing(cfg, monkeypatch):
    """compile_only hands each kernel the call needs (the reduce kernel too) to Triton's
    warmup and launches none; the same call run is the reference's product."""
    calls = []
    for kernel in (gemv_mod._gemv_kernel, gemv_mod._split_k_reduce_kernel):
        real = kernel.run

        def spy(*a, _real=real, _name=kernel.fn.__name__, **kw):
            calls.append((_name, kw["warmup"]))
            return _real(*a, **kw)
        monkeypatch.setattr(kernel, "run", spy)
    x, w = torch.randn(3, 64), torch.randn(40, 64)
    gemv(x, w, config=cfg, compile_only=True)
    names = {"_gemv_kernel"} | ({"_split_k_reduce_kernel"} if cfg.split_mode == "reduce"
                                and cfg.split_k > 1 else set())
    assert {name for name, _ in calls} == names and all(warm for _, warm in calls), calls
    calls.clear()
    y = gemv(x, w, config=cfg)
    assert calls and not any(warm for _, warm in calls)
    torch.testing.assert_close(y, x @ w.T, rtol=1e-4, atol=1e-4)


def test_lm_head_compiles_its_gemv_only_where_it_takes_one(monkeypatch):
    """ParallelLMHead.compile_logits: the GEMV the head would launch, compiled and not run
    (False where the head takes cuBLAS, or the table has no config for the shape)."""
    from loom.kernels import gemv_decode
    from loom.layers.embedding import ParallelLMHead
    head = ParallelLMHead(40, 64)
    hidden = torch.randn(2, 64)
    head._linear = F.linear
    assert head.compile_logits(hidden) is False
    head._linear = gemv_decode.linear
    compiled = []
    monkeypatch.setattr(gemv_decode, "gemv", lambda x, w, **kw: compiled.append(kw))
    monkeypatch.setattr(gemv_decode, "tuned_config", lambda *a: None)
    assert head.compile_logits(hidden) is False and compiled == []
    cfg = GemvConfig(block_n=16, block_k=32)
    monkeypatch.setattr(gemv_decode, "tuned_config", lambda m, n, k, dtype, device: cfg)
    assert head.compile_logits(hidden) is True
    assert compiled == [{"config": cfg, "compile_only": True}]
    assert head.compile_logits(torch.randn(17, 64)) is False  # beyond the GEMV's rows
