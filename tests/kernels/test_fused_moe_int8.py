"""The fused MoE kernels with 8-bit integer experts (W8A16, bits=8: GPTQ-Int8's and
compressed-tensors' W8A16 MoE checkpoints): four values a word, zero points about 128,
checked as test_fused_moe_int4 checks int4 (its helpers: compressed-tensors' packing, the
float64 reference); the op's bits argument, misreadings refused, the int8 tuned table and
`loom bench moe --weight-dtype int8`'s experts."""

import pytest
import torch

from tests.kernels.test_fused_moe_int4 import (  # noqa: F401  (_seed: the autouse fixture)
    DEVICE, DTYPES, INTERPRET, _case, _inputs, _seed, _tile, check, experts_reference,
    fused_moe, int4_weight, make_int4_moe, moe_reference)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_zero", [False, True], ids=["sym", "zero"])
@pytest.mark.parametrize("path", ["gemv", "grouped-gemm"])
def test_8bit_experts(path, with_zero, dtype, caplog):
    """Both kernels with 8-bit experts: zero points 0..255 in groups of 32 (the grouped
    GEMM's 64-column K step capped to 32, said in the log), or none (128) in one group a
    row of 96 columns; 64-column GEMV chunks (16 words a row)."""
    from loom.kernels import moe_quant
    group = 32 if with_zero else "K"
    args, quant, want = _case(group, with_zero, dtype, tokens=3 if path == "gemv" else 13,
                              bits=8)
    assert args[1].shape[-1] * 4 == args[0].shape[1]  # four values a word
    tiles = dict(gemv=1, block_n=64, block_k=64) if path == "gemv" else \
        dict(block_m=16, block_n=64, block_k=64)
    moe_quant._say_capped.cache_clear()
    with caplog.at_level("INFO", logger="loom.kernels.moe_quant"):
        check(fused_moe(*args, **quant, **tiles), want, DTYPES[dtype])
    lines = [r.getMessage() for r in caplog.records if "BLOCK_K 64" in r.getMessage()]
    g = quant["group_size"]
    assert lines == ([] if path == "gemv" else
                     [f"fused_moe: the config's BLOCK_K 64 does not divide the int8 weights' "
                      f"{g}-column groups; the grouped GEMM steps K by 32 instead"])


def test_8bit_tma_smallest_step_groups_from_scales_and_reference():
    """The grouped GEMM's 8-bit tiles through TMA descriptors at the smallest K step (16
    columns: four words, 16 bytes a row) and the default tiles; group_size None with a
    scale per channel of experts whose H (64) and I (96) differ (each weight's K is its
    words times four); moe_reference (bits=8) matches the integers' float64 product."""
    args, quant, want = make_int4_moe(11, 64, 64, 4, 2, 32, True, torch.float32, bits=8)
    check(fused_moe(*args, **quant, block_m=16, block_n=32, block_k=16, tma=1), want,
          torch.float32)
    check(fused_moe(*args, **quant), want, torch.float32)
    check(moe_reference(*args, **quant), want, torch.float32)
    hidden, inter, experts = 64, 96, 4
    (w13, s13, _), d13 = int4_weight(experts, 2 * inter, hidden, hidden, False,
                                     torch.float32, bits=8)
    (w2, s2, _), d2 = int4_weight(experts, hidden, inter, inter, False, torch.float32, bits=8)
    x = torch.randn(13, hidden)
    weights, ids = torch.softmax(torch.randn(13, experts), dim=-1).topk(2, dim=-1)
    want = experts_reference(x.double(), d13, d2, weights.double(), ids)
    args = [t.to(DEVICE) for t in (x, w13, w2, weights, ids)]
    scales = dict(w13_scale=s13.to(DEVICE), w2_scale=s2.to(DEVICE), bits=8)
    for tiles in (dict(gemv=1, block_n=32, block_k=32), dict(block_m=16, block_n=32)):
        check(fused_moe(*args, **scales, **tiles), want, torch.float32)
    check(moe_reference(*args, **scales), want, torch.float32)


def test_the_op_takes_bits():
    """torch.ops.loom.fused_moe: bits after group_size in its schema (default 4), and its
    fake; a bits other than 4 or 8 is refused by the op, its fake, fused_moe,
    compile_fused_moe and moe_reference, naming bits."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from loom.kernels.fused_moe import compile_fused_moe
    args, quant, want = make_int4_moe(2, 64, 32, 4, 2, 32, True, torch.float32, bits=8)
    out = torch.ops.loom.fused_moe(*args, quant["w13_scale"], quant["w2_scale"], None,
                                   quant["w13_zero"], quant["w2_zero"], 32, 8)
    check(out, want, torch.float32)
    schema = str(torch.ops.loom.fused_moe.default._schema)
    assert schema.endswith("int? group_size=None, int bits=4) -> Tensor"), schema
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = torch.ops.loom.fused_moe(*args, **quant)
        assert fake.shape == args[0].shape and fake.dtype == args[0].dtype
        with pytest.raises(ValueError, match="bits=2"):
            torch.ops.loom.fused_moe(*args, **{**quant, "bits": 2})
    bad = {**quant, "bits": 5}
    cfg = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4,
           "num_stages": 2, "GEMV": 0, "TMA": 0}
    for call in (lambda: fused_moe(*args, **bad), lambda: torch.ops.loom.fused_moe(*args, **bad),
                 lambda: compile_fused_moe(*args, cfg, **bad),
                 lambda: moe_reference(*args, **bad)):
        with pytest.raises(ValueError, match=r"bits must be 4 or 8 .*bits=5"):
            call()


def test_8bit_misreadings_are_refused():
    """int4 words read as 8-bit (half the columns: the scales no longer fit), 8-bit ones
    read as int4 (twice the columns: hidden no longer fits), bits beside bf16 experts."""
    args, quant = _inputs()
    with pytest.raises(ValueError, match=r"w13_scale of shape \(4, 64, 2\) is not "
                                         r"\(4, 64, 1\)"):
        fused_moe(*args, **quant, bits=8)
    args8, quant8, _ = make_int4_moe(3, 64, 32, 4, 2, 32, False, torch.bfloat16, bits=8)
    with pytest.raises(ValueError, match=r"w13_scale of shape \(4, 64, 2\) is not "
                                         r"\(4, 64, 4\)"):
        fused_moe(*args8, **{**quant8, "bits": 4})
    with pytest.raises(ValueError, match=r"int8: w13 \[E, 2I, H / 4\]"):
        fused_moe(args8[0][:, :32].contiguous(), *args8[1:], **quant8)
    x, _, _, weights, ids = args
    with pytest.raises(ValueError, match="bits is for int4 experts or 8-bit integer ones"):
        fused_moe(x, torch.zeros(4, 64, 64, dtype=torch.bfloat16),
                  torch.zeros(4, 64, 32, dtype=torch.bfloat16), weights, ids, bits=8)


def test_8bit_experts_take_their_own_table(tmp_path, monkeypatch):
    """8-bit experts' tuned file is dtype=int8_w8a16 (their int32 words would otherwise
    read as int4's): looked up first, else the built-in defaults (neither int4's table nor
    the activations')."""
    import json

    from loom.kernels import moe_config as mc
    from loom.kernels.moe_quant import table_dtype
    words = torch.zeros(8, 128, 8, dtype=torch.int32)
    assert table_dtype(words, 8) == "int8_w8a16" and table_dtype(words) == "int4_w4a16"
    assert table_dtype(torch.zeros(1, dtype=torch.bfloat16), 8) == torch.bfloat16
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(mc, "device_name", lambda device: "Some_GPU")
    (tmp_path / mc.config_file_name(8, 64, torch.bfloat16, "Some_GPU")).write_text(
        json.dumps({"16": _tile(32)}))
    (tmp_path / mc.config_file_name(8, 64, "int4_w4a16", "Some_GPU")).write_text(
        json.dumps({"16": _tile(128)}))
    mc.load_config_file.cache_clear()

    def lookup():
        return mc.get_config(16, 2, 8, 64, torch.bfloat16, "cuda",
                             weight_dtype=table_dtype(words, 8))
    assert lookup() == mc.default_config(16, 2, 8, torch.bfloat16)  # not int4's or bf16's
    (tmp_path / "E=8,N=64,dtype=int8_w8a16,device_name=Some_GPU.json").write_text(
        json.dumps({"16": _tile(64)}))
    mc.load_config_file.cache_clear()
    assert lookup() == _tile(64)


def test_bench_int8_experts(monkeypatch, capsys):
    """`loom bench moe --weight-dtype int8`'s experts are what fused_moe takes with bits=8,
    their products O(1); the CLI takes the name."""
    from loom.bench import moe_timing as bench
    from loom.cli import main
    gen = torch.Generator().manual_seed(0)
    w13, s13, z13 = bench.random_int4_experts(4, 256, 256, torch.float32, gen, bits=8)
    w2, s2, z2 = bench.random_int4_experts(4, 256, 128, torch.float32, gen, bits=8)
    assert (w13.shape, s13.shape, z13.dtype) == ((4, 256, 64), (4, 256, 2), torch.uint8)
    assert 96 <= int(z13.min()) and int(z13.max()) <= 160
    x = torch.randn(2, 256)
    ids = torch.tensor([[0, 3], [1, 2]])
    quant = dict(w13_scale=s13, w2_scale=s2, w13_zero=z13, w2_zero=z2, group_size=128, bits=8)
    out = moe_reference(x, w13, w2, torch.full((2, 2), 0.5), ids, **quant)
    assert 0.01 < out.std().item() < 1
    if INTERPRET:
        check(fused_moe(x, w13, w2, torch.full((2, 2), 0.5), ids, **quant, gemv=1),
              out.double(), torch.float32)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "moe", "--weight-dtype", "int8", "--batch-sizes", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
