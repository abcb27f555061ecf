"""The fused MoE kernels with fp8 experts (W8A16): the grouped GEMM and the GEMV read
float8_e4m3fn weights with float32 scales, per output channel or per block, against the
plain-torch reference on the same weights dequantized here in float64.

CPU: Triton's interpreter, tiny shapes with ragged tiles and ragged scale blocks. The
weights are drawn with magnitudes that differ from row to row and from column range to
column range, so each block's scale differs from its neighbours' by up to 8x: a scale read
for the wrong row or block column is far outside the tolerances.
"""

import os
import zlib

import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from loom.kernels import moe_gemm  # noqa: E402
from loom.kernels.fused_moe import fused_moe  # noqa: E402
from loom.kernels.interpreter import interpreted, patch_interpreter  # noqa: E402
from loom.layers.moe import experts_reference  # noqa: E402

INTERPRET = interpreted(moe_gemm._down_kernel)
cpu_only = pytest.mark.skipif(not INTERPRET, reason="CPU checks need TRITON_INTERPRET=1")
if INTERPRET:
    patch_interpreter()
FP8 = torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def _uneven(experts, rows, cols):
    """randn / sqrt(cols) with each row and each 8-column range scaled by 2^U(-1.5, 1.5)."""
    row = 2 ** (torch.rand(experts, rows, 1) * 3 - 1.5)
    col = (2 ** (torch.rand(experts, 1, -(-cols // 8)) * 3 - 1.5)).repeat_interleave(8, 2)
    return torch.randn(experts, rows, cols) * row * col[:, :, :cols] / cols ** 0.5


def quantize(w, block):
    """w [E, N, K] -> fp8 values and float32 scales: amax / 448 per row ([E, N, 1]), or per
    (rows, cols) block of `block` ([E, ceil(N / rows), ceil(K / cols)])."""
    if block is None:
        scale = w.abs().amax(dim=2, keepdim=True) / 448
        return (w / scale).clamp(-448, 448).to(FP8), scale
    (e, n, k), (bn, bk) = w.shape, block
    nb, kb = -(-n // bn), -(-k // bk)
    padded = torch.zeros(e, nb * bn, kb * bk)
    padded[:, :n, :k] = w
    tiles = padded.view(e, nb, bn, kb, bk)
    scale = tiles.abs().amax(dim=(2, 4)) / 448
    q = (tiles / scale[:, :, None, :, None]).clamp(-448, 448).view(e, nb * bn, kb * bk)
    return q[:, :n, :k].to(FP8), scale


def dequantize(q, scale, block):
    """float64 q * its scale, each element's own (row, or block) scale spelled out."""
    e, n, k = q.shape
    if block is None:
        return q.double() * scale.double().reshape(e, n, 1)
    rows = torch.arange(n) // block[0]
    cols = torch.arange(k) // block[1]
    return q.double() * scale.double()[:, rows][:, :, cols]


def make_fp8_moe(tokens, hidden, inter, experts, top_k, block, quantize_w2=True):
    """Inputs for fused_moe with fp8 experts, and the float64 reference output."""
    x = torch.randn(tokens, hidden)
    w13, s13 = quantize(_uneven(experts, 2 * inter, hidden), block)
    w2, s2 = quantize(_uneven(experts, hidden, inter), block)
    if not quantize_w2:
        w2, s2 = _uneven(experts, hidden, inter), None
    weights, ids = torch.softmax(torch.randn(tokens, experts), dim=-1).topk(top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    ref_w2 = w2.double() if s2 is None else dequantize(w2, s2, block)
    want = experts_reference(x.double(), dequantize(w13, s13, block), ref_w2,
                             weights.double(), ids)
    scales = dict(w13_scale=s13, w2_scale=s2, weight_block=block)
    return (x, w13, w2, weights, ids), scales, want


def check(out, want):
    # float32 accumulation over K <= 64 products of O(1) values (fp8 values are exact in
    # float32, each scale one rounding): errors ~1e-6; a wrong scale is off by >= 10%.
    torch.testing.assert_close(out.double(), want, atol=1e-4, rtol=1e-4)


# (tokens, hidden, inter, experts, top_k, weight block, tiles)
GROUPED = {
    "channel": (9, 48, 40, 4, 2, None, dict(block_m=16, block_n=32, block_k=32)),
    "channel-tma": (9, 48, 32, 4, 2, None, dict(block_m=16, block_n=16, block_k=16, tma=1)),
    # ragged blocks both ways (48 = 1.5 blocks of 32 columns; 40 rows of 16-row blocks)
    "block": (13, 48, 40, 4, 3, (16, 32), dict(block_m=16, block_n=16, block_k=16)),
    "block-tma": (13, 64, 32, 4, 2, (32, 32), dict(block_m=16, block_n=32, block_k=32,
                                                   tma=1)),
    # rows blocks of 24 (not a power of two): only columns must be
    "block-rows-24": (7, 32, 24, 3, 2, (24, 16), dict(block_m=16, block_n=16, block_k=16)),
}


@cpu_only
@pytest.mark.parametrize("case", GROUPED.values(), ids=GROUPED.keys())
def test_grouped_gemm_fp8(case):
    tokens, hidden, inter, experts, top_k, block, tiles = case
    args, scales, want = make_fp8_moe(tokens, hidden, inter, experts, top_k, block)
    check(fused_moe(*args, **scales, **tiles), want)


# (tokens, hidden, inter, experts, top_k, weight block, block_n, block_k): chunks inside a
# block, chunks spanning two or four block columns with a ragged K edge, one-row blocks
GEMV = {
    "channel": (2, 40, 24, 6, 2, None, 16, 32),
    "block-narrow-chunks": (1, 64, 48, 8, 4, (32, 32), 16, 16),
    "block-wide-chunks": (3, 80, 48, 4, 2, (16, 16), 8, 64),
    "block-one-row": (2, 32, 32, 4, 2, (32, 16), 1, 32),
}


@cpu_only
@pytest.mark.parametrize("case", GEMV.values(), ids=GEMV.keys())
def test_gemv_fp8(case):
    tokens, hidden, inter, experts, top_k, block, bn, bk = case
    args, scales, want = make_fp8_moe(tokens, hidden, inter, experts, top_k, block)
    check(fused_moe(*args, **scales, gemv=1, block_n=bn, block_k=bk), want)


@cpu_only
@pytest.mark.parametrize("gemv", [0, 1])
def test_per_channel_scale_as_two_dims_and_an_unquantized_w2(gemv):
    """A [E, N] scale reads as [E, N, 1]; w13 fp8 beside an unquantized w2."""
    args, scales, want = make_fp8_moe(5, 32, 32, 4, 2, None, quantize_w2=False)
    scales["w13_scale"] = scales["w13_scale"].squeeze(2)
    tiles = dict(block_n=16, block_k=16)
    check(fused_moe(*args, **scales, gemv=gemv, **tiles), want)


@cpu_only
def test_block_k_wider_than_a_block_steps_by_the_block(caplog):
    """The grouped GEMM's K step must lie within one block column: a config's wider
    BLOCK_K is capped at the block's columns, and the log says so once."""
    args, scales, want = make_fp8_moe(9, 64, 32, 4, 2, (16, 16))
    from loom.kernels import moe_quant
    moe_quant._say_capped.cache_clear()
    with caplog.at_level("INFO", logger="loom.kernels.moe_quant"):
        for _ in range(2):
            check(fused_moe(*args, **scales, block_m=16, block_n=16, block_k=64), want)
    lines = [r.getMessage() for r in caplog.records if "BLOCK_K" in r.getMessage()]
    assert len(lines) == 1 and "BLOCK_K 64" in lines[0] and "by 16" in lines[0]


def _fp8_inputs(block=None):
    args, scales, _ = make_fp8_moe(3, 32, 16, 4, 2, block)
    return args, scales


@pytest.mark.parametrize("change, message", [
    (dict(w13_scale=torch.ones(4, 16)), r"w13_scale of shape \(4, 16\) fits neither"),
    (dict(w2_scale=torch.ones(4, 32, 2)), r"w2_scale of shape \(4, 32, 2\) fits neither"),
    (dict(w13_scale=torch.ones(4, 2, 2), weight_block=(16, 24)),
     "w13_scale's blocks are 24 columns wide"),
    (dict(w2_scale=None), "w2 is torch.float8_e4m3fn and needs w2_scale"),
    (dict(w2_scale=torch.ones(4, 32, 1, dtype=torch.float64)), "w2_scale must be float32"),
    (dict(weight_block=(0, 16), w13_scale=torch.ones(4, 2, 2)), "two positive sizes"),
])
def test_bad_scales_are_refused_by_name(change, message):
    args, scales = _fp8_inputs()
    with pytest.raises(ValueError, match=message):
        fused_moe(*args, **{**scales, **change})


def test_a_scale_for_an_unquantized_weight_is_refused():
    args, scales = _fp8_inputs()
    x, w13, w2, weights, ids = args
    with pytest.raises(ValueError, match="w13_scale is given for a torch.float32 w13"):
        fused_moe(x, w13.float(), w2, weights, ids, **scales)


def _tile(block_m):
    return {"BLOCK_M": block_m, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4,
            "num_stages": 2, "GEMV": 0, "TMA": 0}


def test_fp8_experts_take_their_own_table_else_the_bf16_ones(tmp_path, monkeypatch, caplog):
    """Looked up by the weights' dtype first; without an fp8 table the activations'
    dtype's tiles serve, said once."""
    import json

    from loom.kernels import moe_config as mc
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(mc, "device_name", lambda device: "Some_GPU")
    bf16 = tmp_path / mc.config_file_name(8, 64, torch.bfloat16, "Some_GPU")
    bf16.write_text(json.dumps({"16": _tile(32)}))
    mc._say_fallback.cache_clear()

    def lookup():
        return mc.get_config(16, 2, 8, 64, torch.bfloat16, "cuda", weight_dtype=FP8)
    with caplog.at_level("INFO", logger="loom.kernels.moe_config"):
        assert lookup() == _tile(32) and lookup() == _tile(32)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "E=8,N=64,dtype=float8_e4m3fn,device_name=Some_GPU" in lines[0]
    assert bf16.name in lines[0]
    (tmp_path / mc.config_file_name(8, 64, FP8, "Some_GPU")).write_text(
        json.dumps({"16": _tile(64)}))
    mc.load_config_file.cache_clear()
    assert lookup() == _tile(64)


@pytest.mark.gpu
@pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(),
                    reason="needs CUDA and compiled Triton")
@pytest.mark.parametrize("tokens", [1, 64, 2048])
@pytest.mark.parametrize("block", [None, (128, 128)], ids=["channel", "block"])
@pytest.mark.parametrize("config", [None, {"GEMV": 1, "BLOCK_N": 8, "BLOCK_K": 512},
                                    {"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64, "TMA": 1,
                                     "num_warps": 8}], ids=["tuned", "gemv", "tma"])
def test_fused_moe_gpu_fp8_bf16(tokens, block, config):
    """Qwen3-30B-A3B's experts, bf16 activations: bf16 rounding of the SwiGLU product and
    of the output (the same bounds as test_fused_moe's bf16 check). The reference takes the
    bf16 tokens and dequantizes in float64 on the GPU."""
    quantize_w = _gpu_experts(block)
    x = torch.randn(tokens, 2048, device="cuda").to(torch.bfloat16)
    logits = torch.randn(tokens, 128, device="cuda")
    weights, ids = torch.softmax(logits, dim=-1).topk(8, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    (w13, s13, d13), (w2, s2, d2) = quantize_w
    want = experts_reference(x.double(), d13, d2, weights.double(), ids)
    out = fused_moe(x, w13, w2, weights, ids, w13_scale=s13, w2_scale=s2, weight_block=block,
                    config=config)
    torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=3e-2)


_GPU_EXPERTS = {}


def _gpu_experts(block):
    """Qwen3-30B-A3B's experts in fp8 on the GPU, with their float64 dequantized values:
    drawn once per layout."""
    if block not in _GPU_EXPERTS:
        gen = torch.Generator().manual_seed(0)
        pairs = []
        for shape in ((128, 1536, 2048), (128, 2048, 768)):
            w = torch.randn(*shape, generator=gen) / shape[2] ** 0.5
            q, scale = quantize(w, block)
            q, scale = q.cuda(), scale.cuda()
            pairs.append((q, scale, dequantize(q, scale, block)))
        _GPU_EXPERTS[block] = pairs
    return _GPU_EXPERTS[block]


_FP8_OFFLINE_COMPILE = r"""
import os
os.environ["TRITON_INTERPRET"] = "0"
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile as tcompile
from loom.kernels.moe_gemm import _down_kernel, _gate_up_kernel
from loom.kernels.moe_gemv import _down_gemv_kernel, _gate_up_gemv_kernel

def build(fn, types, cons, warps, stages=3):
    names = list(fn.arg_names)
    sig = {n: "constexpr" if n in cons else "i32" if n.startswith(("num_", "stride_"))
           else types[n] for n in names}
    src = ASTSource(fn=fn, signature=sig,
                    constexprs={(names.index(k),): v for k, v in cons.items()},
                    attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
                           if sig[n].startswith("*") or n.startswith("stride_")})
    kernel = tcompile(src, target=GPUTarget("cuda", 90, 32),
                      options=dict(num_warps=warps, num_stages=stages))
    assert kernel.asm["cubin"] and kernel.metadata.shared <= 227 * 1024
    return kernel

# Qwen3-30B-A3B's experts: per channel, and 128x128 blocks (QUANT 1, 2)
BM, BN, BK = 128, 128, 64
for quant, groups in ((1, (1, 1)), (2, (128, 128))):
    q = dict(QUANT=quant, GROUP_N=groups[0], GROUP_K=groups[1], HAS_ZERO=0)
    for tma in (0, 1):
        w = f"tensordesc<fp8e4nv[{BN}, {BK}]>" if tma else "*fp8e4nv"
        types = {"x_ptr": "*bf16", "w13_ptr": w, "w2_ptr": w, "out_ptr": "*bf16",
                 "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32",
                 "topk_weights_ptr": "*fp32", "s_ptr": "*fp32", "z_ptr": "*u8"}
        for fn in (_gate_up_kernel, _down_kernel):
            types["inter_ptr"] = ("*bf16" if fn is _gate_up_kernel or not tma
                                  else f"tensordesc<bf16[{BM}, {BK}]>")
            cons = dict(TOP_K=8, HIDDEN=2048, INTER=768, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
                        GROUP_M=8, PRECISION="tf32", TMA=tma, **q)
            cons = {k: v for k, v in cons.items() if k in fn.arg_names}
            build(fn, types, cons, warps=8)
            print("ok", fn.__name__, quant, tma)
    types = {"x_ptr": "*bf16", "w13_ptr": "*fp8e4nv", "inter_ptr": "*bf16",
             "w2_ptr": "*fp8e4nv", "out_ptr": "*bf16", "ids_ptr": "*i64",
             "topk_weights_ptr": "*fp32", "s_ptr": "*fp32", "z_ptr": "*u8", "exponent": "i32"}
    # the H200 table's decode chunks: 512 and 1024 columns, four and eight blocks wide
    for block_n, block_k, stages in ((8, 512, 3), (4, 1024, 2)):
        parts = block_k // groups[1] if quant == 2 else 1
        for fn in (_gate_up_gemv_kernel, _down_gemv_kernel):
            cons = dict(TOP_K=8, HIDDEN=2048, INTER=768, BLOCK_N=block_n, BLOCK_K=block_k,
                        NUM_STAGES=stages, K_PARTS=parts, CONV=0, **q)
            build(fn, types, cons, warps=4)
            print("ok", fn.__name__, quant, block_k)
"""


def test_fp8_kernels_compile_for_sm90_offline():
    """Both scalings of the grouped GEMM (pointer loads and TMA descriptors over the fp8
    weights) and of the GEMV at the tuned tables' tiles build for Hopper within its shared
    memory."""
    from tests.triton_interpreter import compile_for_sm90_offline
    assert compile_for_sm90_offline(_FP8_OFFLINE_COMPILE).count("ok") == 16
