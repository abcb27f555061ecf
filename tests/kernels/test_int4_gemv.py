"""The one-to-four-row integer GEMV (loom.kernels.int4_gemv) against x @ w^T in float64
from the integers themselves, packed by compressed-tensors' own `pack_to_int32`
(test_int4_linear's cases): 4 and 8 bits, with and without zero points, float32, bfloat16
and float16 rows, whole and split K, ragged N, strided rows; an offline sm_90 compile.

On the CPU the kernel runs in Triton's interpreter; with CUDA on the GPU. Every check draws
fresh inputs."""

import os

import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")
pytest.importorskip("triton")
pytest.importorskip("compressed_tensors.compressors.pack_quantized.helpers")

from loom.kernels import int4_gemv as mod  # noqa: E402
from tests.kernels.test_int4_linear import DEVICE, _case, _check, _reference  # noqa: E402


def _gemv(x, packed, scale, zero, group, bits, config):
    out = mod.int4_gemv(x.to(DEVICE), packed.to(DEVICE), scale.to(DEVICE),
                        None if zero is None else zero.to(DEVICE), group, bits, 0,
                        config=config)
    assert out.dtype == x.dtype and out.shape == (x.shape[0], packed.shape[0])
    return out.cpu()


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("with_zero", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("conv", [0, 1])
def test_matches_float64(m, bits, with_zero, dtype, conv):
    # N = 40 against BLOCK_N 16: a ragged last block; K split in 2 slices of 2 steps
    if conv and (bits != 4 or DEVICE == "cpu"):
        pytest.skip("prmt (inline PTX) takes 4 bits, on CUDA")
    x, packed, scale, zero, q, zq = _case(m, 256, 40, 64, with_zero, dtype, bits)
    cfg = mod.GemvConfig(block_n=16, block_k=32, split_k=2 if m % 2 else 1, conv=conv,
                         prefetch=m % 2)
    _check(_gemv(x, packed, scale, zero, 64, bits, cfg), _reference(x, q, zq, scale, 64,
                                                                     bits), dtype)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block_n,block_k,split", [(8, 128, 2), (4, 256, 1)])
def test_steps_of_several_groups(m, bits, block_n, block_k, split):
    """A step over 2 or 4 groups (its scales and zero points a group each): K = 256 in two
    slices of one step, or in one step."""
    x, packed, scale, zero, q, zq = _case(m, 256, 24, 64, True, torch.bfloat16, bits)
    cfg = mod.GemvConfig(block_n=block_n, block_k=block_k, split_k=split, prefetch=1)
    _check(_gemv(x, packed, scale, zero, 64, bits, cfg), _reference(x, q, zq, scale, 64,
                                                                     bits), torch.bfloat16)


def test_every_value_and_zero_point_and_strided_rows():
    """Each 4-bit value against each zero point (the float32 bit trick's whole range), and
    rows with a stride past their width."""
    x, packed, scale, zero, q, zq = _case(2, 128, 32, 16, True, torch.bfloat16)
    q[:, :16] = torch.arange(-8, 8, dtype=torch.int8)
    zq[:16, 0] = torch.arange(-8, 8, dtype=torch.int8)
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32
    packed = pack_to_int32(q, 4)
    zero = (zq.to(torch.int16) + 8).to(torch.uint8)
    wide = torch.randn(2, 200).to(torch.bfloat16)
    wide[:, :128] = x
    got = mod.int4_gemv(wide[:, :128].to(DEVICE), packed.to(DEVICE), scale.to(DEVICE),
                        zero.to(DEVICE), 16, 4, 16).cpu()
    _check(got, _reference(x, q, zq, scale, 16), torch.bfloat16)


def test_refusals():
    x, packed, scale, zero, _, _ = _case(5, 128, 32, 64, True, torch.bfloat16)
    with pytest.raises(ValueError, match="1..4 rows"):
        _gemv(x, packed, scale, zero, 64, 4, mod.GemvConfig(16, 64))
    with pytest.raises(ValueError, match="must be a power of two dividing"):
        _gemv(x[:1], packed, scale, zero, 64, 4, mod.GemvConfig(16, 96))
    with pytest.raises(ValueError, match="must be a power of two dividing"):
        _gemv(x[:1], packed, scale, zero, 64, 4, mod.GemvConfig(16, 256))  # K is 128
    with pytest.raises(ValueError, match="conv 1"):  # prmt: 4 bits only (and CUDA)
        _gemv(x[:1], packed, scale, zero, 64, 8, mod.GemvConfig(16, 64, conv=1))


def test_default_config_splits_k_for_the_sms():
    """K split for about 16 programs (of one warp) per SM at one row, 4 (of two) at two,
    each split a divisor of the K steps; steps that fit the group and K."""
    for n, k in ((6144, 4096), (28672, 4096), (4096, 14336)):
        for m in (1, 2):
            cfg = mod.default_config(m, n, k, 128, 128, sms=132)
            assert mod._step_fits(cfg.block_k, 128, k) and (k // cfg.block_k) % cfg.split_k == 0
            programs = -(-n // cfg.block_n) * cfg.split_k
            assert 2 * 132 <= programs * cfg.num_warps * m <= 32 * 132
    # the H100 searches' best forms for 8B's projections, at one row and two
    shapes = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
    assert [mod.default_config(1, n, k, 128, 128).split_k for n, k in shapes] == [2, 4, 1, 4]
    assert [mod.default_config(2, n, k, 128, 128).split_k for n, k in shapes] == [8, 16, 2, 16]
    # a group of 96 (a step of 32 inside it) or K not a multiple of 256: the 128-row form
    assert mod.default_config(1, 6144, 4032, 96, 32) == mod.GemvConfig(64, 32, 9, 2, 1)
    assert mod.default_config(1, 6144, 4224, 128, 128).block_k == 128


_OFFLINE_COMPILE = r"""
from loom.kernels.int4_gemv import EXPONENT_128, _int4_gemv_kernel
types = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*u8",
         "out_ptr": "*fp32"}
for bits, conv, prefetch in ((4, 0, 0), (4, 1, 1), (8, 0, 1)):
    for m in (1, 4):
        ptx = build(_int4_gemv_kernel, types, dict(M=m, N=4096, K=4096, GROUP=128,
                    HAS_ZERO=True, BITS=bits, BLOCK_N=128, BLOCK_K=128, SPLIT_K=4,
                    CONV=conv, PREFETCH=prefetch), 4, 1)
        print(bits, conv, m, "fma.rn.f32" in ptx,
              not any(f"cvt.rn.f32.{t}32" in ptx for t in "su"),
              ("prmt.b32" in ptx) == bool(conv))
"""


def test_kernel_compiles_for_sm90_offline():
    """Both widths and both conversions at one and four rows compile for sm_90 with
    Triton's own ptxas (no GPU here): FMAs, no int-to-float conversion of the values (the
    bit trick), prmt where asked."""
    from tests.triton_interpreter import SM90_BUILD, compile_for_sm90_offline
    out = compile_for_sm90_offline(SM90_BUILD + _OFFLINE_COMPILE).splitlines()
    assert out == [f"{bits} {conv} {m} True True True" for bits, conv in (
        (4, 0), (4, 1), (8, 0)) for m in (1, 4)], out
