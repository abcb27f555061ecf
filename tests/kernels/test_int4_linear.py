"""The W4A16 and W8A16 kernel (loom.kernels.int4_linear, bits 4 and 8) against x @ w^T
computed in float64 from the integers themselves: the weights are packed by
compressed-tensors' own `pack_to_int32` (the checkpoint format the layout comes from) and
the zero points unpacked from it, so the reference shares no packing code with the kernel.
Decode rows (split-K) and prompt rows (the tiled GEMM), groups of 32 to a whole row, with
and without zero points, float32 and bfloat16; loom.quantization.int4's `dequantize` (4 and
8 bits) against compressed-tensors' unpacking; what `supports` refuses; the op's fake; and an
offline sm_90 compile of both regimes at both widths.

On the CPU the kernel runs in Triton's interpreter; with CUDA the same checks run on the
GPU. Every check draws fresh inputs.
"""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")
helpers = pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")

from loom.kernels import int4_linear as mod  # noqa: E402
from loom.kernels.interpreter import interpreted, patch_interpreter  # noqa: E402
from loom.quantization.int4 import dequantize  # noqa: E402

DEVICE = "cpu" if interpreted(mod._int4_kernel) else "cuda"
if DEVICE == "cpu":
    patch_interpreter()  # bfloat16 dot operands multiplied as values
_seed = iter(range(10_000))


def _case(m, k, n, group, with_zero, dtype, bits=4):
    """x, packed, scale, zero (uint8 or None) as the loader hands them, and the signed
    int8 weight and zero points they came from (-2^(bits - 1) .. 2^(bits - 1) - 1, stored
    plus 2^(bits - 1))."""
    gen = torch.Generator().manual_seed(next(_seed))
    groups, mid = k // group, 1 << (bits - 1)
    q = torch.randint(-mid, mid, (n, k), generator=gen, dtype=torch.int8)
    packed = helpers.pack_to_int32(q, bits)
    scale = (torch.rand(n, groups, generator=gen) + 0.5) / (mid * k ** 0.5)
    zq = zero = None
    if with_zero:  # zero points as compressed-tensors stores them: packed along N
        zq = torch.randint(-mid, mid, (n, groups), generator=gen, dtype=torch.int8)
        zero = (helpers.unpack_from_int32(helpers.pack_to_int32(zq, bits, packed_dim=0), bits,
                                          zq.shape, packed_dim=0).to(torch.int16) + mid
                ).to(torch.uint8).contiguous()
    x = torch.randn(m, k, generator=gen)
    return x.to(dtype), packed, scale.to(dtype), zero, q, zq


def _reference(x, q, zq, scale, group, bits=4):
    mid = 1 << (bits - 1)
    q = q.double() + mid
    z = float(mid) if zq is None else (zq.double() + mid).unsqueeze(-1)
    w = (q.view(q.shape[0], -1, group) - z) * scale.double().unsqueeze(-1)
    return (w.reshape(q.shape) @ x.double().T).T


def _check(out, want, dtype):
    # float32: float32 sums. bfloat16: x and the scales are the reference's own values;
    # the output's one rounding to 8 bits of mantissa.
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    scale = want.abs().max().item()
    err = (out.double() - want).abs().max().item()
    assert err <= tol * scale, f"max error {err} against {scale}"


def _run(x, packed, scale, zero, group, config=None, bits=4):
    args = [x.to(DEVICE), packed.to(DEVICE), scale.to(DEVICE),
            None if zero is None else zero.to(DEVICE), group]
    assert mod.supports(*args, bits=bits)
    if bits != 4:  # bits=4 left to the defaults
        args.append(bits)
    out = mod.int4_matmul(*args, config=config) if config else \
        torch.ops.loom.int4_linear(*args)
    assert out.dtype == x.dtype and out.shape == (x.shape[0], packed.shape[0])
    return out.cpu()


@pytest.mark.parametrize("m", [1, 5, 16, 40])
@pytest.mark.parametrize("group", [32, 64, 128, None])  # None: one group a row
@pytest.mark.parametrize("with_zero", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_float64(m, group, with_zero, dtype):
    k, n = (256, 32) if (m + (group or 0)) % 64 else (128, 96)  # both shapes, mixed
    group = group or k
    x, packed, scale, zero, q, zq = _case(m, k, n, group, with_zero, dtype)
    _check(_run(x, packed, scale, zero, group), _reference(x, q, zq, scale, group), dtype)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("with_zero", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prompt_rows_dequantize_as_the_reference(bits, with_zero, dtype):
    """Past DECODE_ROWS the op dequantizes the weight whole (then a dense GEMM): each value
    equals `dequantize`'s float32 one rounded once to the activations' dtype."""
    x, packed, scale, zero, _, _ = _case(40, 256, 96, 64, with_zero, dtype, bits)
    args = [t if t is None else t.to(DEVICE) for t in (packed, scale, zero)]
    got = mod.dequantize_packed(*args, 64, bits).cpu()
    want = dequantize(packed, scale, zero, 64, bits)
    assert got.dtype == dtype
    if dtype == torch.float32 or DEVICE == "cuda":
        assert torch.equal(got, want.to(dtype))
    else:  # the interpreter's float32 -> bfloat16 cast truncates: within one bf16 step
        torch.testing.assert_close(got.float(), want, rtol=2 ** -7, atol=0)


@pytest.mark.parametrize("config", [
    mod.Int4Config(16, 32, 32, split_k=1),   # decode, one program walks all of K
    mod.Int4Config(16, 64, 16, split_k=4),   # several steps a slice, groups of 2 steps
    mod.Int4Config(128, 128, 32, num_warps=8),  # the large prompt tile, ragged M and N
    mod.Int4Config(32, 32, 32, swizzle_m=2),    # several row tiles in the swizzle
    mod.Int4Config(16, 32, 128, split_k=2, slabs=True, convert=2),  # decode by slabs
    mod.Int4Config(64, 64, 128, slabs=True, convert=2),  # prompt rows by slabs, ragged M
])
def test_configs(config):
    m = 7 if config.block_m == 16 else 70
    group = config.block_k  # a group a step
    x, packed, scale, zero, q, zq = _case(m, 256, 96, group, True, torch.bfloat16)
    want = _reference(x, q, zq, scale, group)
    _check(_run(x, packed, scale, zero, group, config), want, torch.bfloat16)


@pytest.mark.parametrize("slabs", [False, True])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_integer_conversions_agree_bit_for_bit(slabs, bits, dtype):
    """The three ways `_less_zeros` turns q - zero into x's dtype (a cast; float32 from its
    bits; the 16-bit dtype's own bits) give the same values, so the same output to the
    bit, and the reference's, over every value and zero point at both widths; whether
    each step unpacks the words whole or dots them one value position at a time (slabs,
    the K sum in another order)."""
    mid = 1 << (bits - 1)
    x, packed, scale, zero, q, zq = _case(9, 256, 128, 128, True, dtype, bits)
    q[:, :2 * mid] = torch.arange(-mid, mid, dtype=torch.int8)  # every value in each row
    zq.view(-1)[:2 * mid] = torch.arange(-mid, mid, dtype=torch.int8)  # every zero point
    packed = helpers.pack_to_int32(q, bits)
    zero = (zq.to(torch.int16) + mid).to(torch.uint8)
    outs = [_run(x, packed, scale, zero, 128, mod.Int4Config(
        16, 32, 128 if slabs else 32, split_k=2, convert=c, slabs=slabs), bits)
        for c in (0, 1, 2)]
    _check(outs[0], _reference(x, q, zq, scale, 128, bits), dtype)
    assert all(torch.equal(out, outs[0]) for out in outs[1:])


def test_slabs_need_a_dot_of_16():
    x, packed, scale, zero, _, _ = _case(1, 256, 32, 64, True, torch.bfloat16)
    with pytest.raises(ValueError, match="slabs"):
        _run(x, packed, scale, zero, 64, mod.Int4Config(16, 32, 64, slabs=True))


# -- 8-bit weights (W8A16: GPTQ-Int8, compressed-tensors' W8A16), bits=8 -----------------

def test_integers_up_to_255_are_exact_in_bf16_and_fp16():
    """The kernel multiplies x by (q - zero), -255..255 for 8 bits, in x's dtype before
    scaling: every one of these 511 integers survives bfloat16 (8 significant bits hold
    every integer up to 256 in magnitude) and float16; 257 would not."""
    ints = torch.arange(-255, 256, dtype=torch.float64)
    assert ints.numel() == 511
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(ints.to(dtype).double(), ints), dtype
    assert torch.tensor(257.0).to(torch.bfloat16).item() != 257


@pytest.mark.parametrize("m", [1, 40], ids=["decode", "prompt"])
@pytest.mark.parametrize("with_zero", [False, True], ids=["sym", "zero"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_8bit_matches_float64(m, with_zero, dtype):
    """Decode rows (split-K) and prompt rows (the tiled GEMM), groups of 64 and a whole
    row, zero points 0..255 or none (128)."""
    k, n, group = (256, 32, 64) if with_zero else (128, 96, 128)
    x, packed, scale, zero, q, zq = _case(m, k, n, group, with_zero, dtype, bits=8)
    assert packed.shape == (n, k // 4)
    _check(_run(x, packed, scale, zero, group, bits=8),
           _reference(x, q, zq, scale, group, bits=8), dtype)


def test_8bit_configs_negative_words_and_zero_extremes():
    """Every word's top byte >= 128 (negative int32 words, so a shift without the mask
    would carry their sign in), zero points 0 and 255; the smallest K step (16 columns:
    four words) with K split four ways, and a 128-row tile."""
    x, packed, scale, zero, q, zq = _case(7, 256, 64, 32, True, torch.bfloat16, bits=8)
    q[:, 3::4] = torch.randint(0, 128, q[:, 3::4].shape, dtype=torch.int8)  # 128..255
    packed = helpers.pack_to_int32(q, 8)
    assert (packed < 0).all()
    zq[0], zq[1] = -128, 127
    zero = (zq.to(torch.int16) + 128).to(torch.uint8)
    want = _reference(x, q, zq, scale, 32, bits=8)
    _check(_run(x, packed, scale, zero, 32, mod.Int4Config(16, 64, 16, split_k=4), bits=8),
           want, torch.bfloat16)
    big = torch.cat([x] * 10)  # 70 rows
    _check(_run(big, packed, scale, zero, 32, mod.Int4Config(128, 128, 32), bits=8),
           torch.cat([want] * 10), torch.bfloat16)


def test_8bit_unpack_and_dequantize_match_compressed_tensors():
    """loom.quantization.int4's 8-bit `unpack` and `dequantize` against
    compressed-tensors' unpacking."""
    from loom.quantization.int4 import unpack
    for with_zero in (False, True):
        _, packed, scale, zero, q, zq = _case(1, 256, 48, 64, with_zero, torch.float32, 8)
        unpacked = helpers.unpack_from_int32(packed, 8, q.shape).float() + 128
        assert torch.equal(unpacked, q.float() + 128)
        assert torch.equal(unpack(packed, 8).float(), unpacked)
        z = 128 if zero is None else zero.float().repeat_interleave(64, 1)
        want = (unpacked - z) * scale.repeat_interleave(64, 1)
        assert torch.equal(dequantize(packed, scale, zero, 64, 8), want)


def test_8bit_fallback_refusals_and_fake():
    """Groups of 24 (no K step): the 8-bit weight dequantized, a float32 matmul. A 4-bit
    reading of 8-bit words is refused (K mismatch); bits other than 4 or 8 are a
    ValueError naming bits, from the op, its fake and every helper."""
    x, packed, scale, zero, q, zq = _case(4, 144, 32, 24, True, torch.float32, bits=8)
    assert not mod.supports(x, packed, scale, zero, 24, bits=8)
    out = torch.ops.loom.int4_linear(x, packed, scale, zero, 24, 8)
    _check(out, _reference(x, q, zq, scale, 24, bits=8), torch.float32)
    x, packed, scale, zero, _, _ = _case(2, 256, 32, 64, True, torch.bfloat16, bits=8)
    assert mod.supports(x, packed, scale, zero, 64, bits=8)
    assert not mod.supports(x, packed, scale, zero, 64)  # 64 words are 512 int4 columns
    assert mod.kernel_applies(14336, 128, 8) and not mod.kernel_applies(256, 96, 8)
    for bits in (2, 5, 16):
        for call in (lambda: torch.ops.loom.int4_linear(x, packed, scale, zero, 64, bits),
                     lambda: mod.int4_linear(x, packed, scale, zero, 64, bits),
                     lambda: mod.supports(x, packed, scale, zero, 64, bits),
                     lambda: mod.kernel_applies(256, 64, bits),
                     lambda: mod.int4_matmul(x, packed, scale, zero, 64, bits),
                     lambda: dequantize(packed, scale, zero, 64, bits)):
            with pytest.raises(ValueError, match=f"bits must be 4 or 8.*bits={bits}"):
                call()
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        out = torch.ops.loom.int4_linear(x, packed, scale, zero, 64, 8)
        assert out.shape == (2, 32) and out.dtype == torch.bfloat16
        with pytest.raises(ValueError, match="bits=3"):
            torch.ops.loom.int4_linear(x, packed, scale, zero, 64, 3)


def test_bench_int4_takes_bits(capsys):
    """`loom bench int4 --bits 8` gets as far as the GPU check; other widths are refused."""
    from loom.cli import main
    if not torch.cuda.is_available():
        assert main(["bench", "int4", "--bits", "8"]) != 0
        assert "int4: needs a CUDA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "int4", "--bits", "5"])
    assert "--bits: invalid choice: 5" in capsys.readouterr().err


def test_strided_rows_and_negative_words():
    """Rows of x a wider tensor's (row stride 2K); every word's top nibble >= 8 (negative
    int32 words), both zero-point extremes."""
    x, packed, scale, zero, q, zq = _case(3, 128, 32, 64, True, torch.float32)
    q[:, 7::8] = 7  # w_q 15 in every word's top nibble
    packed = helpers.pack_to_int32(q, 4)
    assert (packed < 0).all()
    zq[0], zq[1] = -8, 7
    zero = (zq.to(torch.int16) + 8).to(torch.uint8)
    wide = torch.cat([x, torch.full_like(x, float("nan"))], dim=1)[:, :128]
    _check(_run(wide, packed, scale, zero, 64), _reference(x, q, zq, scale, 64),
           torch.float32)


def test_dequantize_matches_compressed_tensors():
    for with_zero in (False, True):
        _, packed, scale, zero, q, zq = _case(1, 256, 48, 64, with_zero, torch.float32)
        unpacked = helpers.unpack_from_int32(packed, 4, q.shape).float() + 8
        assert torch.equal(unpacked, q.float() + 8)
        z = 8 if zero is None else zero.float().repeat_interleave(64, 1)
        want = (unpacked - z) * scale.repeat_interleave(64, 1)
        assert torch.equal(mod.dequantize(packed, scale, zero, 64), want)


def test_empty_rows_odd_groups_and_fallback():
    x, packed, scale, zero, q, zq = _case(0, 128, 32, 32, True, torch.bfloat16)
    assert _run(x, packed, scale, zero, 32).shape == (0, 32)
    # groups of 48 = 3 x 16: K steps of 16, nine of them
    x, packed, scale, zero, q, zq = _case(4, 144, 32, 48, True, torch.float32)
    _check(_run(x, packed, scale, zero, 48), _reference(x, q, zq, scale, 48), torch.float32)
    # groups of 24, which the kernel cannot take: the dequantized weight, a float32 matmul
    x, packed, scale, zero, q, zq = _case(4, 144, 32, 24, False, torch.float32)
    assert not mod.supports(x, packed, scale, zero, 24)
    out = torch.ops.loom.int4_linear(x, packed, scale, zero, 24)
    _check(out, _reference(x, q, zq, scale, 24), torch.float32)


def test_supports_refuses():
    x, packed, scale, zero, _, _ = _case(2, 256, 32, 64, True, torch.bfloat16)
    assert mod.supports(x, packed, scale, zero, 64)
    assert mod.supports(x, packed, scale, None, 64)
    assert not mod.supports(x, packed, scale, zero, 96)  # K not a multiple of G
    g24 = torch.zeros(32, 8, dtype=torch.bfloat16)  # K = 192 in groups of 24
    assert not mod.supports(x[:, :192], packed[:, :24].contiguous(), g24, None, 24)
    assert not mod.supports(x, packed.to(torch.int8), scale, zero, 64)
    assert not mod.supports(x, packed, scale.float(), zero, 64)  # scale not x's dtype
    assert not mod.supports(x, packed, scale, zero.to(torch.int32), 64)
    assert not mod.supports(x, packed[:, :16].contiguous(), scale, zero, 64)  # K mismatch
    assert not mod.supports(x.t().contiguous().t(), packed, scale, zero, 64)
    assert not mod.supports(x.to(torch.int8), packed, scale, zero, 64)
    assert mod.kernel_applies(14336, 128) and mod.kernel_applies(144, 48)
    assert not any(mod.kernel_applies(k, g) for k, g in [(256, 96), (192, 24), (12, 4)])


def test_fake_gives_shape_and_dtype():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(5, 256, dtype=torch.bfloat16)
        packed = torch.empty(96, 32, dtype=torch.int32)
        scale = torch.empty(96, 2, dtype=torch.bfloat16)
        for zero in (None, torch.empty(96, 2, dtype=torch.uint8)):
            out = torch.ops.loom.int4_linear(x, packed, scale, zero, 128)
            assert out.shape == (5, 96) and out.dtype == torch.bfloat16


_OFFLINE_COMPILE = r"""
from loom.kernels.int4_linear import (_dequant_kernel, _int4_kernel, _sum_splits_kernel,
                                      default_config)
types = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*u8",
         "part_ptr": "*fp32"}
for bits in (4, 8):
    for m in (1, 4096):  # decode (16-row tile, split-K partials), prompt (128 x 128 tiles)
        cfg = default_config(m, 4096, 4096, 128)
        for zero in (False, True):
            out = dict(types, out_ptr="*fp32" if cfg.split_k > 1 else "*bf16")
            cons = dict(N=4096, K=4096, GROUP=128, HAS_ZERO=zero, BLOCK_M=cfg.block_m,
                        BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k,
                        SWIZZLE_M=cfg.swizzle_m, DOT_PRECISION="tf32", BITS=bits,
                        CONVERT=cfg.convert, SLABS=cfg.slabs)
            ptx = build(_int4_kernel, out, cons, cfg.num_warps, cfg.num_stages)
            print(bits, m, cfg.split_k > 1, int(zero), "mma.sync" in ptx or "wgmma" in ptx)
    for convert in (1, 2):  # decode by slabs, each conversion: no int -> float cvt left
        cons.update(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, CONVERT=convert,
                    SLABS=True)
        ptx = build(_int4_kernel, dict(types, out_ptr="*fp32"), cons, 4, 4)
        print(bits, "slabs", convert, "mma.sync" in ptx, "cvt.rn.bf16.s32" not in ptx)
build(_sum_splits_kernel, dict(types, out_ptr="*bf16"), dict(SPLIT_K=4, BLOCK=1024), 4)
print("sum ok")
for bits in (4, 8):
    build(_dequant_kernel, dict(types, out_ptr="*bf16"), dict(
        N=4096, K=4096, GROUP=128, HAS_ZERO=True, BITS=bits, BLOCK_N=64, BLOCK_K=128), 4)
print("dequant ok")
"""


def test_kernels_compile_for_sm90_offline():
    """Both regimes at both widths (BITS 4 and 8), and the prompt rows' dequantize, compile
    for the H200 with Triton's own ptxas (no GPU here), the products on the tensor cores."""
    from tests.triton_interpreter import SM90_BUILD, compile_for_sm90_offline
    out = compile_for_sm90_offline(SM90_BUILD + _OFFLINE_COMPILE).splitlines()
    assert out == [f"{bits} {line}" for bits in (4, 8) for line in (
        "1 True 0 True", "1 True 1 True", "4096 False 0 True", "4096 False 1 True",
        "slabs 1 True True", "slabs 2 True True")] + ["sum ok", "dequant ok"], out
