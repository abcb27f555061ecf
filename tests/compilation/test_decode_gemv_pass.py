"""LOOM_DECODE_GEMV=1: decode-size matmuls go through loom.decode_linear, which takes the
Triton GEMV (interpreted here) where a config exists, and generation is unchanged."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import loom.kernels.gemv_decode as gemv_module
from loom.kernels.gemv import GemvConfig
from loom.kernels.gemv_decode import tuned_config
from tests.compilation.test_level3 import _tokens
from tests.conftest import graphs_compiled_anew


@pytest.mark.slow
def test_decode_matmuls_take_the_gemv_and_tokens_stay(tiny_model_factory, monkeypatch, caplog):
    path, _ = tiny_model_factory("llama")
    eager = _tokens(path)
    rows, with_silu, with_norm = [], [], []
    real_gemv, real_norm_gemv = gemv_module.gemv, gemv_module.add_rms_norm_gemv

    def spy(x, weight, **kwargs):
        rows.append(x.shape[0])
        with_silu.append(kwargs.get("silu_mul_input", False))
        return real_gemv(x, weight, **kwargs)

    def norm_spy(x, *args, **kwargs):
        with_norm.append(x.shape[0])
        return real_norm_gemv(x, *args, **kwargs)

    monkeypatch.setenv("LOOM_DECODE_GEMV", "1")
    monkeypatch.setenv("LOOM_DECODE_NORM_GEMV", "1")
    # Every shape "measured" (the CPU has no table): tiles as wide as the tiny model's
    # matrices, so that the interpreter runs few programs (its cost is per program and op).
    monkeypatch.setattr(gemv_module, "tuned_config",
                        lambda m, n, k, dtype, device: GemvConfig(block_n=64, block_k=64))
    monkeypatch.setattr(gemv_module, "gemv", spy)
    monkeypatch.setattr(gemv_module, "add_rms_norm_gemv", norm_spy)
    caplog.set_level(logging.INFO, logger="loom.compilation.passes.decode_gemv")
    # A fresh Inductor cache: a graph cached by an earlier run is loaded without the pass
    # running again (so without its log line).
    with graphs_compiled_anew():
        assert _tokens(path, compilation_config={"level": 3}) == eager
    assert "matmuls take the Triton GEMV" in caplog.text
    # Each layer's down projection reads silu(gate) * up straight from gate_up's output
    # (one per piece of the graph split at attention; the tiny model has 2 layers).
    fused = re.findall(r"(\d+) of them with the SiLU·mul before them", caplog.text)
    assert sum(map(int, fused)) == 2, fused
    assert any(with_silu) and not all(with_silu)
    assert rows and max(rows) <= gemv_module.MAX_M, "decode steps (3 requests) took the GEMV"
    assert 3 in rows
    # The residual add + norm before qkv and gate_up, but the first layer's input norm
    # (no residual yet): 3 of the tiny model's 4 norms before a matmul.
    fused = re.findall(r"(\d+) with the residual add \+ RMSNorm", caplog.text)
    assert sum(map(int, fused)) == 3, fused
    assert with_norm and max(with_norm) <= gemv_module.MAX_M and 3 in with_norm


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["fp8", "int8"])
def test_8bit_decode_fuses_the_norm_and_silu_and_tokens_stay(weights, tiny_model_factory,
                                                              monkeypatch, caplog, tmp_path):
    """--quantization fp8 (or an int8 W8A8 checkpoint) through loom::fp8_linear (as on
    CUDA; here the interpreted GEMV, and torch's CPU _scaled_mm or the interpreted int8
    GEMM): at level 3 the pass hands each 8-bit projection's norm or SiLU·mul to the GEMV
    with the weight's scales, and the tokens equal the eager run's, where the same op runs
    with the norm and SiLU·mul as kernels of their own."""
    from loom.kernels import fp8_linear
    from loom.quantization.fp8 import Fp8Linear
    path, _ = tiny_model_factory("llama")
    kwargs = {"quantization": "fp8"}
    if weights == "int8":
        pytest.importorskip("compressed_tensors")
        from tests.conftest import make_tiny_model
        from tests.quantization.fp8_checkpoints import write_fp8_checkpoint
        path, kwargs = str(tmp_path / "int8"), {}
        write_fp8_checkpoint(make_tiny_model("llama", str(tmp_path / "base")), path,
                             "int8-dynamic", ["lm_head"])
    scaled, silu, norm = [], [], []
    real_gemv, real_norm_gemv = gemv_module.gemv, gemv_module.add_rms_norm_gemv

    def spy(x, weight, **kwargs):
        scaled.append(kwargs.get("weight_scale") is not None)
        silu.append(kwargs.get("silu_mul_input", False))
        return real_gemv(x, weight, **kwargs)

    def norm_spy(x, *args, **kwargs):
        norm.append(kwargs.get("weight_scale") is not None)
        return real_norm_gemv(x, *args, **kwargs)

    monkeypatch.setattr(Fp8Linear, "use_op", staticmethod(lambda x: True))
    monkeypatch.setenv("LOOM_DECODE_GEMV", "1")
    monkeypatch.setenv("LOOM_DECODE_NORM_GEMV", "1")
    monkeypatch.setattr(gemv_module, "tuned_config",
                        lambda m, n, k, dtype, device: GemvConfig(block_n=64, block_k=64))
    monkeypatch.setattr(gemv_module, "gemv", spy)
    monkeypatch.setattr(fp8_linear, "gemv", spy)
    monkeypatch.setattr(gemv_module, "add_rms_norm_gemv", norm_spy)
    eager = _tokens(path, **kwargs, compilation_config={"level": 0})
    # the op's own GEMVs at decode (the lm_head's bf16 ones beside them): no neighbours
    assert any(scaled) and not any(silu) and not norm
    scaled.clear()
    caplog.set_level(logging.INFO, logger="loom.compilation.passes.decode_gemv")
    with graphs_compiled_anew():
        assert _tokens(path, **kwargs, compilation_config={"level": 3}) == eager
    fused = re.findall(r"(\d+) of them with the SiLU·mul before them", caplog.text)
    assert sum(map(int, fused)) == 2, fused
    fused = re.findall(r"(\d+) with the residual add \+ RMSNorm", caplog.text)
    assert sum(map(int, fused)) == 3, fused
    assert any(silu) and any(scaled) and norm and all(norm)


def test_decode_silu_mul_linear_is_the_mlps_down_projection(monkeypatch):
    """With a row-reduction config: the GEMV applying the activation itself; with a
    tensor-core one, the activation first, then the GEMV; without one (or past 16 rows):
    torch's silu * up then F.linear. All against plain torch."""
    x, w = torch.randn(3, 32), torch.randn(4, 16)
    ref = F.linear(F.silu(x[:, :16]) * x[:, 16:], w)
    torch.testing.assert_close(torch.ops.loom.decode_silu_mul_linear(x, w), ref)
    launched = []
    real_gemv = gemv_module.gemv

    def spy(x, weight, **kwargs):
        launched.append((x.shape[1], kwargs.get("silu_mul_input", False)))
        return real_gemv(x, weight, **kwargs)
    monkeypatch.setattr(gemv_module, "gemv", spy)
    for use_dot, want in ((False, (32, True)), (True, (16, False))):
        cfg = GemvConfig(block_n=16, block_k=16, use_dot=use_dot)
        monkeypatch.setattr(gemv_module, "tuned_config", lambda *a, cfg=cfg: cfg)
        launched.clear()
        torch.testing.assert_close(torch.ops.loom.decode_silu_mul_linear(x, w), ref)
        assert launched == [want], (use_dot, launched)
    monkeypatch.undo()
    many = torch.randn(17, 32)
    torch.testing.assert_close(torch.ops.loom.decode_silu_mul_linear(many, w),
                               F.linear(F.silu(many[:, :16]) * many[:, 16:], w))


def test_decode_add_rms_norm_linear_is_the_norm_then_the_projection(monkeypatch):
    """Without a config (or past 16 rows): loom's fused_add_rms_norm then F.linear; with
    one: the GEMV reading x + residual through the norm. Both outputs against the
    reference ops."""
    from loom.layers.norm import fused_add_rms_norm
    w, norm_w = torch.randn(12, 32), 1 + 0.1 * torch.randn(32)
    for rows in (3, 17):
        x, residual = torch.randn(rows, 32), torch.randn(rows, 32)
        normed, ref_res = fused_add_rms_norm(x, residual, norm_w, 1e-6)
        y, res_out = torch.ops.loom.decode_add_rms_norm_linear(x, residual, norm_w, 1e-6, w)
        assert torch.equal(res_out, ref_res) and torch.equal(y, F.linear(normed, w))
    monkeypatch.setattr(gemv_module, "tuned_config",
                        lambda m, n, k, dtype, device: GemvConfig(block_n=16, block_k=16))
    x, residual = torch.randn(3, 32), torch.randn(3, 32)
    normed, ref_res = fused_add_rms_norm(x, residual, norm_w, 1e-6)
    y, res_out = torch.ops.loom.decode_add_rms_norm_linear(x, residual, norm_w, 1e-6, w)
    torch.testing.assert_close(res_out, ref_res, rtol=0, atol=0)
    torch.testing.assert_close(y, F.linear(normed, w), rtol=1e-5, atol=1e-5)


def test_decode_linear_falls_back_to_cublas_without_a_config():
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    assert torch.equal(torch.ops.loom.decode_linear(x, w), F.linear(x, w))
    many = torch.randn(17, 8)  # more rows than the GEMV takes
    assert torch.equal(torch.ops.loom.decode_linear(many, w), F.linear(many, w))


def test_lm_head_logits_take_the_gemv_at_decode_sizes(monkeypatch):
    """The logits are computed eagerly, outside the compiled graph: with the decode GEMV on,
    up to 16 rows go through the GEMV where a config exists (every shape here), more rows
    and the GEMV turned off through F.linear."""
    from loom.layers.embedding import ParallelLMHead
    calls = []
    real_gemv = gemv_module.gemv

    def spy(x, weight, **kwargs):
        calls.append(x.shape[0])
        return real_gemv(x, weight, **kwargs)
    monkeypatch.setattr(gemv_module, "tuned_config",
                        lambda m, n, k, dtype, device: GemvConfig(block_n=64, block_k=64))
    monkeypatch.setattr(gemv_module, "gemv", spy)
    for flag, rows, expected in (("1", 3, [3]), ("1", 16, [16]), ("1", 17, []), ("0", 3, [])):
        monkeypatch.setenv("LOOM_DECODE_GEMV", flag)
        head = ParallelLMHead(40, 32)
        head.weight.data.normal_()
        hidden = torch.randn(rows, 32)
        calls.clear()
        torch.testing.assert_close(head.compute_logits(hidden), F.linear(hidden, head.weight))
        assert calls == expected, (flag, rows, calls)


def test_tuned_config_takes_the_smallest_measured_rows_at_or_above(tmp_path, monkeypatch):
    table = {"16,32": {"1": {"block_n": 8, "block_k": 32}, "4": {"block_n": 16, "block_k": 32,
                                                                   "use_dot": True},
                       "8": None, "16": {"block_n": 32, "block_k": 32, "use_dot": True}}}
    (tmp_path / "gemv,dtype=float32,device_name=cpu.json").write_text(json.dumps(table))
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    gemv_module._table.cache_clear()
    try:
        cpu = torch.device("cpu")
        assert tuned_config(1, 16, 32, torch.float32, cpu).block_n == 8
        assert tuned_config(3, 16, 32, torch.float32, cpu).use_dot  # 3 rows take 4's
        # 5..8 rows take 8's entry: cuBLAS was faster there, not 16's config
        assert all(tuned_config(m, 16, 32, torch.float32, cpu) is None for m in (5, 8))
        assert tuned_config(9, 16, 32, torch.float32, cpu).block_n == 32  # up to MAX_M
        assert tuned_config(17, 16, 32, torch.float32, cpu) is None  # never measured
        assert tuned_config(1, 32, 32, torch.float32, cpu) is None  # another shape
        for rows in (3, 12):  # the GEMV (interpreted), 12 rows padded to 16
            x, w = torch.randn(rows, 32), torch.randn(16, 32)
            torch.testing.assert_close(torch.ops.loom.decode_linear(x, w), F.linear(x, w))
    finally:
        gemv_module._table.cache_clear()


def test_the_norm_table_decides_where_the_gemv_applies_the_norm(tmp_path, monkeypatch):
    """A shape in the "gemv_norm" table takes its config at the smallest measured row count
    >= m and the two kernels elsewhere, whatever the plain table says; a shape it lacks
    follows the plain table's config where that reduces rows unsplit. The op launches the
    fused GEMV with the config chosen and matches the reference norm then product."""
    from loom.layers.norm import fused_add_rms_norm
    row = {"block_n": 8, "block_k": 16, "num_warps": 4, "num_stages": 1}
    plain = {"12,32": {"8": {"block_n": 16, "block_k": 32}},          # rows: fused
             "16,32": {"8": {"block_n": 16, "block_k": 32, "use_dot": True}},
             "24,32": {"8": {"block_n": 16, "block_k": 32}}}
    norm = {"16,32": {"2": row}, "24,32": {}}  # 16: fused at <= 2 rows; 24: never
    (tmp_path / "gemv,dtype=float32,device_name=cpu.json").write_text(json.dumps(plain))
    (tmp_path / "gemv_norm,dtype=float32,device_name=cpu.json").write_text(json.dumps(norm))
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    gemv_module._table.cache_clear()
    try:
        def config(m, n):
            return gemv_module.norm_config(m, torch.empty(n, 32), torch.float32)

        assert config(1, 16) == GemvConfig(**row)
        assert config(2, 16) == GemvConfig(**row)
        assert config(3, 16) is None  # the dot tile's rows
        assert config(1, 24) is None  # the table said no
        assert config(5, 12).block_n == 16  # plain's rows
        assert config(9, 12) is None  # past its rows
        used = []
        real = gemv_module.add_rms_norm_gemv

        def spy(*args, config, **kwargs):
            used.append(config)
            return real(*args, config=config, **kwargs)

        monkeypatch.setattr(gemv_module, "add_rms_norm_gemv", spy)
        w, norm_w = torch.randn(16, 32), 1 + 0.1 * torch.randn(32)
        for rows in (2, 3):
            x, residual = torch.randn(rows, 32), torch.randn(rows, 32)
            normed, ref_res = fused_add_rms_norm(x, residual, norm_w, 1e-6)
            y, res_out = torch.ops.loom.decode_add_rms_norm_linear(x, residual, norm_w,
                                                                   1e-6, w)
            torch.testing.assert_close(res_out, ref_res, rtol=0, atol=0)
            torch.testing.assert_close(y, F.linear(normed, w), rtol=1e-5, atol=1e-5)
        assert used == [GemvConfig(**row)]  # 2 rows fused; 3 rows: the two kernels
    finally:
        gemv_module._table.cache_clear()


def test_every_shipped_gemv_table_reads_back():
    """Each GEMV table shipped in loom/kernels/configs parses as the decode path reads it
    (a typo fails here, not on a user's first decode step): whole K chunks, row counts the
    GEMV takes, and only unsplit row-reduction configs in the gemv_norm tables."""
    from loom.kernels.tuned import CONFIG_DIR
    files = sorted(CONFIG_DIR.glob("gemv*,dtype=*,device_name=*.json"))
    kinds = {p.name.split(",")[0] for p in files}
    assert {"gemv", "gemv_norm"} <= kinds, files
    for path in files:
        kind, dtype, gpu = re.fullmatch(r"(\w+),dtype=(\w+),device_name=(\S+)\.json",
                                        path.name).groups()
        gemv_module._table.cache_clear()
        table = gemv_module._table(getattr(torch, dtype), gpu, kind)
        assert table or kind == "gemv_norm", path.name
        for (n, k), per_m in table.items():
            for m, cfg in per_m.items():
                assert 1 <= m <= gemv_module.MAX_M and n > 0, (path.name, n, k, m)
                if cfg is None:  # cuBLAS measured faster there
                    continue
                assert k % (cfg.block_k * cfg.split_k) == 0, (path.name, n, k, m)
                if kind == "gemv_norm":
                    assert cfg.split_k == 1 and not cfg.use_dot, (path.name, n, k, m)
    gemv_module._table.cache_clear()


def test_a_gpu_without_a_table_says_so_once(tmp_path, monkeypatch, caplog):
    """A GPU no table was measured on (an H100 took cuBLAS silently until session 23) takes
    cuBLAS, and the operator reads one line saying so and how to measure one; the CPU says
    nothing (it is never tuned)."""
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    gemv_module._table.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="loom.kernels.gemv_decode"):
            for _ in range(3):
                assert gemv_module._table(torch.bfloat16, "NVIDIA_B200") == {}
            assert gemv_module._table(torch.bfloat16, "cpu") == {}
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1, lines
        assert "NVIDIA_B200" in lines[0] and "cuBLAS" in lines[0]
        assert "gemv_bench.py --write-table" in lines[0]
    finally:
        gemv_module._table.cache_clear()


@pytest.mark.slow
def test_tp2_decode_with_the_gemv_equals_tp1(tiny_model_factory, tmp_path, monkeypatch, capfd):
    """The GEMV is on by default on GPUs at any TP size: at TP=2 (two CPU workers, gloo, the
    all-reduce + norm fusion on as well) the pass rewrites each rank's matmuls, a table measured for every per-rank weight shape
    sends the decode steps through the interpreted GEMV (the LM head's shard too, computed
    eagerly after the graph), and the tokens and logprobs are TP=1 eager's."""
    from tests.compilation.test_tp2_passes import _generate
    path, _ = tiny_model_factory("llama")
    cfg = json.loads((Path(path) / "config.json").read_text())
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    vocab = cfg["vocab_size"]
    shapes = [((heads + 2 * kv) * hd // 2, h), (h, heads * hd // 2), (i, h), (h, i // 2),
              (-(-vocab // 2), h)]
    # Tiles as wide as the shards: the interpreter's cost is per program.
    table = {f"{n},{k}": {"8": {"block_n": 64, "block_k": 64}} for n, k in shapes}
    (tmp_path / "gemv,dtype=float32,device_name=cpu.json").write_text(json.dumps(table))
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))  # the workers read it too
    gemv_module._table.cache_clear()
    try:  # the table the workers load: every rank shape has a config for 1..8 rows
        assert all(tuned_config(m, n, k, torch.float32, torch.device("cpu")) is not None
                   for n, k in shapes for m in (1, 8))
    finally:
        gemv_module._table.cache_clear()
    monkeypatch.setenv("TORCHINDUCTOR_FX_GRAPH_CACHE", "0")  # compile for real: log lines
    monkeypatch.setenv("TORCHINDUCTOR_AUTOGRAD_CACHE", "0")
    tokens1, logprobs1 = _generate(path, 1)
    monkeypatch.setenv("LOOM_DECODE_GEMV", "1")
    tokens2, logprobs2 = _generate(path, 2, compilation_config={"level": 3})
    assert tokens2 == tokens1
    torch.testing.assert_close(logprobs2, logprobs1, rtol=1e-4, atol=1e-5)
    log = capfd.readouterr().err
    fused = re.findall(r"rank(\d).*decode_gemv: \d+ matmuls take the Triton GEMV.*?(\d+) of "
                       r"them with the SiLU·mul", log)
    assert {rank for rank, _ in fused} == {"0", "1"}, fused
    # The all-reduce + norm fusion (on by default at TP > 1) in the same graphs, beside the
    # GEMV as on a GPU: its engine check (TP=2's tokens are TP=1's) is this one.
    assert "all_reduce_norm_fusion: dynamic token count up to 64: fused 2 of 2" in log
    assert "all_reduce_norm_fusion: dynamic token count above 64: kept 2 all_reduce" in log


def test_the_norm_goes_into_the_gemv_by_default_and_only_at_tp1(monkeypatch):
    """LOOM_DECODE_NORM_GEMV is on unless 0, at TP=1 only (with TP the all-reduce + norm
    fusion owns the norms); the choice is part of the pass manager's cache key."""
    from loom.compilation.pass_manager import PassManager
    from loom.config import PassConfig

    def fuse_norm(tp):
        gemv_pass = [p for p in PassManager(PassConfig(), tp).passes if p.name == "decode_gemv"]
        return gemv_pass[0].fuse_norm

    monkeypatch.setenv("LOOM_DECODE_GEMV", "1")
    monkeypatch.delenv("LOOM_DECODE_NORM_GEMV", raising=False)
    on = PassManager(PassConfig(), 1).uuid()
    assert fuse_norm(1) is True and fuse_norm(2) is False
    monkeypatch.setenv("LOOM_DECODE_NORM_GEMV", "0")
    assert fuse_norm(1) is False
    assert PassManager(PassConfig(), 1).uuid() != on
