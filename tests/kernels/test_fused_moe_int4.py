"""The fused MoE kernels with int4 experts (W4A16) and 8-bit integer ones (W8A16, bits=8):
the GEMV and the grouped GEMM read packed int32 words with a scale (in the activations'
dtype) and an optional uint8 zero point per group, against x @ w^T computed in float64
from the integers themselves.

The weights are packed by compressed-tensors' own `pack_to_int32` (the checkpoint format
the layout comes from: value + 8 in nibble k % 8 of word k // 8; 8 bits: value + 128 in
byte k % 4 of word k // 4), so the reference shares no packing code with loom. Each scale
differs from its row's and group's neighbours' by up to 8x, so a scale or zero point read
for the wrong group or row is far outside the tolerances.

CPU: Triton's interpreter, tiny shapes with ragged tiles and chunks, groups of 32, 64 and a
whole row (96 columns: a group that is not a power of two), float32 and bfloat16. With
CUDA the same checks run compiled on the GPU. Also: the refusals, the op's schema, the
tuned table's name, `loom bench moe --weight-dtype int4`'s (int8's) weights, and an
offline sm_90 compile of the int4 and 8-bit kernels.
"""

import os
import zlib

import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest  # noqa: E402

pytest.importorskip("triton")
helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")

from loom.kernels import moe_gemm  # noqa: E402
from loom.kernels.fused_moe import fused_moe, moe_reference  # noqa: E402
from loom.kernels.interpreter import interpreted, patch_interpreter  # noqa: E402
from loom.layers.moe import experts_reference  # noqa: E402

INTERPRET = interpreted(moe_gemm._down_kernel)
DEVICE = "cpu" if INTERPRET else "cuda"
if INTERPRET:
    patch_interpreter()  # bfloat16 dot operands multiplied as values


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def int4_weight(experts, rows, cols, group, with_zero, dtype, bits=4):
    """One stacked int4 (bits=8: 8-bit) weight [E, rows, cols]: packed int32
    [E, rows, cols * bits / 32] (by compressed-tensors, expert by expert), scale
    [E, rows, cols / G] in dtype, zero uint8 or None, and its float64 values computed from
    the signed integers drawn."""
    mid = 1 << (bits - 1)
    q = torch.randint(-mid, mid, (experts, rows, cols), dtype=torch.int8)
    packed = torch.stack([helpers.pack_to_int32(q[e], bits) for e in range(experts)])
    groups = cols // group
    scale = (2 ** (torch.rand(experts, rows, groups) * 3 - 1.5)
             / (5 * (mid / 8) * cols ** 0.5)).to(dtype)
    zero = torch.randint(0, 2 * mid, (experts, rows, groups), dtype=torch.uint8) \
        if with_zero else None
    z = float(mid) if zero is None else zero.double().repeat_interleave(group, dim=2)
    values = (q.double() + mid - z) * scale.double().repeat_interleave(group, dim=2)
    return (packed, scale, zero), values


def make_int4_moe(tokens, hidden, inter, experts, top_k, group, with_zero, dtype, bits=4):
    """fused_moe's arguments (on DEVICE) with int4 (bits=8: 8-bit) experts, and the float64
    reference; bits joins the keyword arguments only where it is not the default 4."""
    (w13, s13, z13), d13 = int4_weight(experts, 2 * inter, hidden, group, with_zero, dtype,
                                       bits)
    (w2, s2, z2), d2 = int4_weight(experts, hidden, inter, group, with_zero, dtype, bits)
    x = torch.randn(tokens, hidden).to(dtype)
    weights, ids = torch.softmax(torch.randn(tokens, experts), dim=-1).topk(top_k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    want = experts_reference(x.double(), d13, d2, weights.double(), ids)
    move = (lambda t: None if t is None else t.to(DEVICE))
    args = tuple(move(t) for t in (x, w13, w2, weights, ids))
    quant = dict(w13_scale=move(s13), w2_scale=move(s2), w13_zero=move(z13),
                 w2_zero=move(z2), group_size=group)
    if bits != 4:
        quant["bits"] = bits
    return args, quant, want


def check(out, want, dtype):
    """float32: float32 sums of exact products (~1e-6). bfloat16: the activations and
    scales are the reference's own values; the SwiGLU product's and the output's roundings
    to 8 bits of mantissa (~1%). A wrong group's scale or zero point is off by far more."""
    assert out.dtype == dtype and out.shape == want.shape
    if dtype == torch.float32:
        torch.testing.assert_close(out.double().cpu(), want, atol=1e-4, rtol=1e-4)
        return
    err = (out.double().cpu() - want).abs().max().item()
    assert err <= 2.5e-2 * want.abs().max().item(), (err, want.abs().max().item())


# group -> (hidden, inter): groups of 32 and 64 columns, and one group a row (G = K) with a
# K of 96, whose group is no power of two (K steps of 32)
SHAPES = {32: (64, 96), 64: (128, 64), "K": (96, 96)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _case(group_key, with_zero, dtype_key, tokens, bits=4):
    hidden, inter = SHAPES[group_key]
    group = hidden if group_key == "K" else group_key
    return make_int4_moe(tokens, hidden, inter, 5, 2, group, with_zero, DTYPES[dtype_key],
                         bits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_zero", [False, True], ids=["sym", "zero"])
@pytest.mark.parametrize("group", SHAPES)
def test_gemv_int4(group, with_zero, dtype):
    """A few tokens through the GEMV kernels: 64-column chunks (two 32-column parts, one
    part, or the ragged end of a 96-column row), 64-row blocks past 96 rows."""
    args, quant, want = _case(group, with_zero, dtype, tokens=3)
    check(fused_moe(*args, **quant, gemv=1, block_n=64, block_k=64), want, DTYPES[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_zero", [False, True], ids=["sym", "zero"])
@pytest.mark.parametrize("group", SHAPES)
def test_grouped_gemm_int4(group, with_zero, dtype, caplog):
    """More tokens through the grouped GEMM: a config's 64-column K step capped at the
    group's power of two (32 for G = 32 and G = 96, said in the log), 64-column tiles past
    96 columns."""
    from loom.kernels import moe_quant
    args, quant, want = _case(group, with_zero, dtype, tokens=13)
    tiles = dict(block_m=16, block_n=64, block_k=64)
    moe_quant._say_capped.cache_clear()
    with caplog.at_level("INFO", logger="loom.kernels.moe_quant"):
        check(fused_moe(*args, **quant, **tiles), want, DTYPES[dtype])
    lines = [r.getMessage() for r in caplog.records if "BLOCK_K 64" in r.getMessage()]
    g = quant["group_size"]
    assert lines == ([] if g == 64 else
                     [f"fused_moe: the config's BLOCK_K 64 does not divide the int4 weights' "
                      f"{g}-column groups; the grouped GEMM steps K by 32 instead"])


@pytest.mark.parametrize("tokens", [3, 13], ids=["gemv", "grouped-gemm"])
def test_each_weight_its_own_group_from_its_scales(tokens):
    """group_size None: a scale per channel of experts whose H (64) and I (96) differ, as
    per-channel checkpoints load (each weight's group its own K, read off its scale)."""
    hidden, inter, experts = 64, 96, 4
    (w13, s13, _), d13 = int4_weight(experts, 2 * inter, hidden, hidden, False, torch.float32)
    (w2, s2, _), d2 = int4_weight(experts, hidden, inter, inter, False, torch.float32)
    x = torch.randn(tokens, hidden)
    weights, ids = torch.softmax(torch.randn(tokens, experts), dim=-1).topk(2, dim=-1)
    want = experts_reference(x.double(), d13, d2, weights.double(), ids)
    args = [t.to(DEVICE) for t in (x, w13, w2, weights, ids)]
    check(fused_moe(*args, w13_scale=s13.to(DEVICE), w2_scale=s2.to(DEVICE)), want,
          torch.float32)
    assert s13.shape[-1] == s2.shape[-1] == 1


def test_tma_default_tiles_and_the_reference():
    """The grouped GEMM's int4 tiles through TMA descriptors (32-column K steps: 16 bytes a
    row) and the default tiles; moe_reference (dequantized experts) matches the integers'
    float64 product too."""
    args, quant, want = make_int4_moe(11, 64, 64, 4, 2, 32, True, torch.float32)
    check(fused_moe(*args, **quant, block_m=16, block_n=16, block_k=32, tma=1), want,
          torch.float32)
    check(fused_moe(*args, **quant), want, torch.float32)
    check(moe_reference(*args, **quant), want, torch.float32)


def test_the_op_takes_the_int4_arguments():
    """torch.ops.loom.fused_moe: the int4 tensors after the fp8 ones in its schema (so the
    existing positional callers keep working), and a fake of the right shape."""
    args, quant, want = make_int4_moe(2, 64, 32, 4, 2, 32, True, torch.float32)
    out = torch.ops.loom.fused_moe(*args, quant["w13_scale"], quant["w2_scale"], None,
                                   quant["w13_zero"], quant["w2_zero"], 32)
    check(out, want, torch.float32)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = torch.ops.loom.fused_moe(*args, **quant)
    assert fake.shape == args[0].shape and fake.dtype == args[0].dtype


# -- 8-bit integer experts (W8A16: GPTQ-Int8, compressed-tensors' W8A16), bits=8 -----------

def _inputs(dtype=torch.bfloat16):
    args, quant, _ = make_int4_moe(3, 64, 32, 4, 2, 32, True, dtype)
    return args, quant


@pytest.mark.parametrize("change, message", [
    (dict(group_size=None, w13_scale=torch.ones(4, 64, 3, dtype=torch.bfloat16)),
     "w13_scale's 3 columns do not split w13's 64 input columns into whole groups"),
    (dict(group_size=24), "group_size 24 must divide w13's 64 input columns"),
    (dict(group_size=8), "group_size 8 holds no power-of-two K step >= 16"),
    (dict(w2_scale=None), "w2 is int4 and needs w2_scale"),
    (dict(w13_scale=torch.ones(4, 64, 2)), "w13_scale must be in the activations' dtype"),
    (dict(w13_scale=torch.ones(4, 64, 1, dtype=torch.bfloat16)),
     r"w13_scale of shape \(4, 64, 1\) is not \(4, 64, 2\)"),
    (dict(w2_zero=torch.zeros(4, 64, 1, dtype=torch.int32)), "w2_zero must be uint8"),
    (dict(weight_block=(128, 128)), "weight_block is for fp8 experts"),
])
def test_bad_int4_arguments_are_refused_by_name(change, message):
    args, quant = _inputs()
    with pytest.raises(ValueError, match=message):
        fused_moe(*args, **{**quant, **change})


def test_mixed_or_misshapen_int4_experts_are_refused():
    args, quant = _inputs()
    x, w13, w2, weights, ids = args
    with pytest.raises(ValueError, match="w2 is torch.bfloat16 beside an int4"):
        fused_moe(x, w13, torch.zeros(4, 64, 32, dtype=torch.bfloat16), weights, ids, **quant)
    with pytest.raises(ValueError, match=r"int4: w13 \[E, 2I, H / 8\]"):
        fused_moe(x[:, :32].contiguous(), w13, w2, weights, ids, **quant)
    for name in ("w13_zero", "group_size"):  # int4 arguments beside bf16 experts
        with pytest.raises(ValueError, match=f"{name} is for int4 experts"):
            fused_moe(x, torch.zeros(4, 64, 64, dtype=torch.bfloat16),
                      torch.zeros(4, 64, 32, dtype=torch.bfloat16), weights, ids,
                      **{name: quant[name]})
    args, quant = _inputs(torch.float32)
    with pytest.raises(ValueError, match="int4 experts take bfloat16, float16 or float32"):
        fused_moe(args[0].double(), *args[1:], **{
            **quant, "w13_scale": quant["w13_scale"].double(),
            "w2_scale": quant["w2_scale"].double()})


def _tile(block_m):
    return {"BLOCK_M": block_m, "BLOCK_N": 32, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4,
            "num_stages": 2, "GEMV": 0, "TMA": 0}


def test_int4_experts_take_their_own_table_else_the_defaults(tmp_path, monkeypatch, caplog):
    """Looked up as dtype=int4_w4a16 first; without one the built-in defaults serve, not the
    bf16 table's tiles (slower for int4 on an H100), said once."""
    import json

    from loom.kernels import moe_config as mc
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(mc, "device_name", lambda device: "Some_GPU")
    bf16 = tmp_path / mc.config_file_name(8, 64, torch.bfloat16, "Some_GPU")
    bf16.write_text(json.dumps({"16": _tile(32)}))
    mc._say_fallback.cache_clear()
    int4 = mc.table_dtype(torch.zeros(8, 128, 8, dtype=torch.int32))
    assert int4 == "int4_w4a16"

    def lookup():
        return mc.get_config(16, 2, 8, 64, torch.bfloat16, "cuda", weight_dtype=int4)
    defaults = mc.default_config(16, 2, 8, torch.bfloat16)
    assert defaults != _tile(32)
    with caplog.at_level("INFO", logger="loom.kernels.moe_config"):
        assert lookup() == defaults and lookup() == defaults
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "int4 experts" in lines[0] and "built-in defaults" in lines[0]
    assert "E=8,N=64,dtype=int4_w4a16,device_name=Some_GPU.json" in lines[0]
    assert mc.get_config(16, 2, 8, 64, torch.bfloat16, "cuda") == _tile(32)  # bf16's own
    (tmp_path / mc.config_file_name(8, 64, int4, "Some_GPU")).write_text(
        json.dumps({"16": _tile(64)}))
    mc.load_config_file.cache_clear()
    assert lookup() == _tile(64)
    # the packed weights' own dtype (as a caller holding only the tensor passes it) too
    assert mc.get_config(16, 2, 8, 64, torch.bfloat16, "cuda",
                         weight_dtype=torch.int32) == _tile(64)


def test_bench_int4_experts_and_grid():
    """`loom bench moe --weight-dtype int4`'s experts are what fused_moe takes, their
    products O(1); its search grid drops the grouped-GEMM tiles a 128-column group caps."""
    from loom.bench import moe_timing as bench
    from loom.bench.moe_space import MoeShape
    gen = torch.Generator().manual_seed(0)
    w13, s13, z13 = bench.random_int4_experts(4, 256, 256, torch.float32, gen)
    w2, s2, z2 = bench.random_int4_experts(4, 256, 128, torch.float32, gen)
    assert (w13.shape, s13.shape, z13.dtype) == ((4, 256, 32), (4, 256, 2), torch.uint8)
    x = torch.randn(2, 256)
    ids = torch.tensor([[0, 3], [1, 2]])
    quant = dict(w13_scale=s13, w2_scale=s2, w13_zero=z13, w2_zero=z2, group_size=128)
    out = moe_reference(x, w13, w2, torch.full((2, 2), 0.5), ids, **quant)
    assert 0.01 < out.std().item() < 1
    if INTERPRET:
        want = out.double()
        check(fused_moe(x, w13, w2, torch.full((2, 2), 0.5), ids, **quant, gemv=1), want,
              torch.float32)

    class Fake:
        shape = MoeShape(hidden=2048, inter=768, num_experts=128, top_k=8)
        quant = {"group_size": 128}
        bytes_per_weight = 0.5 + 3 / 128
    space = bench.Bench.search_space(Fake(), 1)
    assert space and all(c["GEMV"] or c["BLOCK_K"] <= 128 for c in space)
    assert {c["GEMV"] for c in space} == {0, 1}


def test_bench_moe_takes_weight_dtype_int4(monkeypatch, capsys):
    from loom.cli import main
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "moe", "--weight-dtype", "int4", "--batch-sizes", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


_INT4_OFFLINE_COMPILE = r"""
from loom.kernels.moe_gemm import _down_kernel, _gate_up_kernel
from loom.kernels.moe_gemv import _down_gemv_kernel, _gate_up_gemv_kernel

def mma(ptx):
    return "wgmma" in ptx or "mma.sync" in ptx

# Qwen3-30B-A3B's experts (H 2048, I 768), groups of 128, with and without zero points;
# int4 (QUANT 3) and 8-bit integers (QUANT 4)
BM, BN, BK = 128, 128, 64
for quant, zero in ((3, 0), (3, 1), (4, 0), (4, 1)):
    q = dict(QUANT=quant, GROUP_N=1, GROUP_K=128, HAS_ZERO=zero)
    per_word = 8 if quant == 3 else 4
    for tma in (0, 1):
        w = f"tensordesc<i32[{BN}, {BK // per_word}]>" if tma else "*i32"
        types = {"x_ptr": "*bf16", "w13_ptr": w, "w2_ptr": w, "out_ptr": "*bf16",
                 "sorted_ids_ptr": "*i32", "block_expert_ptr": "*i32",
                 "topk_weights_ptr": "*fp32", "s_ptr": "*bf16", "z_ptr": "*u8"}
        for fn in (_gate_up_kernel, _down_kernel):
            types["inter_ptr"] = ("*bf16" if fn is _gate_up_kernel or not tma
                                  else f"tensordesc<bf16[{BM}, {BK}]>")
            cons = dict(TOP_K=8, HIDDEN=2048, INTER=768, BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK,
                        GROUP_M=8, PRECISION="tf32", TMA=tma, **q)
            cons = {k: v for k, v in cons.items() if k in fn.arg_names}
            ptx = build(fn, types, cons, 8, aligned=[n for n in fn.arg_names
                                                     if n.startswith("stride_")])
            print("gemm", quant, fn.__name__, zero, tma, mma(ptx),
                  "cp.async.bulk.tensor" in ptx)
    types = {"x_ptr": "*bf16", "w13_ptr": "*i32", "inter_ptr": "*bf16", "w2_ptr": "*i32",
             "out_ptr": "*bf16", "ids_ptr": "*i64", "topk_weights_ptr": "*fp32",
             "s_ptr": "*bf16", "z_ptr": "*u8"}
    # the H200 table's decode chunks: 512 and 1024 columns, four and eight groups wide
    for block_n, block_k, stages in ((8, 512, 3), (4, 1024, 2)):
        for fn in (_gate_up_gemv_kernel, _down_gemv_kernel):
            cons = dict(TOP_K=8, HIDDEN=2048, INTER=768, BLOCK_N=block_n, BLOCK_K=block_k,
                        NUM_STAGES=stages, K_PARTS=block_k // 128, CONV=1, **q)
            ptx = build(fn, types, cons, 4, stages, aligned=["stride_we", "stride_se"])
            print("gemv", quant, fn.__name__, zero, block_k, "ld.local" not in ptx,
                  ("prmt.b32" in ptx) == (quant == 3), "cvt.rn.f32.s32" not in ptx)
"""


def test_int4_kernels_compile_for_sm90_offline():
    """The grouped GEMM (pointer loads and TMA tiles of the packed words, products on the
    tensor cores) and the GEMV at the tuned tables' chunks (nothing spilled; int4 values by
    prmt, no int-to-float conversions) build for Hopper, int4 and 8-bit (QUANT 3 and 4),
    with and without zero points."""
    from tests.triton_interpreter import SM90_BUILD, compile_for_sm90_offline
    out = compile_for_sm90_offline(SM90_BUILD + _INT4_OFFLINE_COMPILE).splitlines()
    gemm = [line for line in out if line.startswith("gemm")]
    gemv = [line for line in out if line.startswith("gemv")]
    assert len(gemm) == 16 and all(line.endswith(("True False", "True True")) for line in gemm)
    assert [line.split()[-1] for line in gemm] == ["False", "False", "True", "True"] * 4
    assert [line.split()[1] for line in gemm] == ["3"] * 8 + ["4"] * 8
    assert len(gemv) == 16 and all(line.endswith("True True True") for line in gemv), out
    assert [line.split()[1] for line in gemv] == ["3"] * 8 + ["4"] * 8
