"""loom/worker/moe_warmup.py: start-up compiles every fused-MoE config a step can pick.

CPU: which configs it asks for, from a tuned table whose nearest-key ranges are worked out
by hand here, and that a failed compile is logged, not raised. CUDA (`-m gpu`): after the
warm-up, steps of every size up to the limit compile nothing (jit_watch counts)."""

import json
import logging

import pytest
import torch

pytest.importorskip("triton")

from loom.kernels import fused_moe as fm  # noqa: E402
from loom.kernels import jit_watch  # noqa: E402
from loom.kernels import moe_config as mc  # noqa: E402
from loom.kernels import moe_route  # noqa: E402,F401  (torch.ops.loom.route_topk)
from loom.layers.moe import FusedMoE  # noqa: E402
from loom.worker import moe_warmup  # noqa: E402


def _tile(block_m, gemv=0):
    return {"BLOCK_M": block_m, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 1, "num_warps": 4,
            "num_stages": 2, "GEMV": gemv, "TMA": 0}


# Keys 1, 64, 256, 4096: the nearest key wins, a tie the smaller, so 1-32 take key 1, 33-160
# key 64, 161-2176 key 256 and 2177 on key 4096.
TABLE = {"1": _tile(16, gemv=1), "64": _tile(16), "256": _tile(32), "4096": _tile(64)}


class _Experts(torch.nn.Module):
    """Two layers of one shape and one of another: two shapes to compile."""

    def __init__(self, dtype, device):
        super().__init__()
        self.a = FusedMoE(4, 2, 64, 48, renormalize=True)
        self.b = FusedMoE(4, 2, 64, 48, renormalize=True)
        self.c = FusedMoE(8, 2, 64, 32, renormalize=True)
        for m in (self.a, self.b, self.c):
            for p in (m.w13, m.w2):
                p.data = (torch.randn(p.shape) / 8).to(dtype=dtype, device=device)


def _write_table(directory, experts, inter, dtype, device_name):
    (directory / mc.config_file_name(experts, inter, dtype, device_name)).write_text(
        json.dumps(TABLE))


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    """TABLE for E=4, N=48, float32 on the CPU; E=8, N=32 has no file (the defaults)."""
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    _write_table(tmp_path, 4, 48, torch.float32, "cpu")
    return _Experts(torch.float32, "cpu")


@pytest.mark.parametrize("max_tokens, multiple, keys", [
    (32, 1, ["1"]), (33, 1, ["1", "64"]), (160, 2, ["1", "64"]), (161, 1, ["1", "64", "256"]),
    (2176, 8, ["1", "64", "256"]), (2177, 1, ["1", "64", "256", "4096"]),
    (2178, 2, ["1", "64", "256", "4096"]), (32, 64, []), (64, 64, ["64"])])
def test_the_configs_of_every_reachable_token_count(tuned, max_tokens, multiple, keys):
    got = moe_warmup.reachable_configs(tuned.a, max_tokens, multiple, torch.device("cpu"))
    assert got == [TABLE[k] for k in keys]


def test_untuned_shapes_take_each_default_once(tuned):
    # E=8, top_k 2: the GEMV kernels up to half a row an expert (2 tokens); then the grouped
    # GEMM, whose default BLOCK_M is 16 up to 16 rows an expert (64 tokens), 32 up to 64
    # (256 tokens), then 64.
    got = moe_warmup.reachable_configs(tuned.c, 1000, 1, torch.device("cpu"))
    assert [(c["GEMV"], c["BLOCK_M"]) for c in got] == [(1, 16), (0, 16), (0, 32), (0, 64)]
    assert all(c == mc.default_config(n, 2, 8, torch.float32)
               for c, n in zip(got, (2, 64, 256, 1000)))


def test_each_shape_compiles_each_config_once(tuned, monkeypatch):
    asked = []

    def record(hidden, w13, w2, weights, ids, cfg, **quant):
        # route_topk's dtypes: a config compiled for others would compile again
        assert (weights.dtype, ids.dtype, hidden.dtype) == (torch.float32, torch.int64,
                                                            w13.dtype)
        asked.append((tuple(w13.shape), cfg["BLOCK_M"], cfg["GEMV"]))
    monkeypatch.setattr(fm, "compile_fused_moe", record)
    n = moe_warmup.warm_up_moe(tuned, 300, 1, torch.device("cpu"))
    assert sorted(asked) == sorted([((4, 96, 64), 16, 1), ((4, 96, 64), 16, 0),
                                    ((4, 96, 64), 32, 0),
                                    ((8, 64, 64), 16, 1), ((8, 64, 64), 16, 0),
                                    ((8, 64, 64), 32, 0), ((8, 64, 64), 64, 0)])
    assert n == 7


def test_no_moe_layer_compiles_nothing(monkeypatch):
    monkeypatch.setattr(fm, "compile_fused_moe", lambda *a, **k: pytest.fail("compiled"))
    assert moe_warmup.warm_up_moe(torch.nn.Linear(2, 2), 100, 1, torch.device("cpu")) == 0


def test_a_failed_compile_is_one_warning(tuned, monkeypatch, caplog):
    def fail(*args, **kwargs):
        raise RuntimeError("out of shared memory")
    monkeypatch.setattr(fm, "compile_fused_moe", fail)
    with caplog.at_level(logging.WARNING, logger="loom.worker.moe_warmup"):
        assert moe_warmup.warm_up_moe(tuned, 100, 1, torch.device("cpu")) == 0
    assert "out of shared memory" in caplog.text and "first use" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and compiled Triton")
def test_no_step_size_compiles_after_the_warm_up(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    name = mc.device_name(torch.device("cuda"))
    _write_table(tmp_path, 4, 48, torch.bfloat16, name)
    model = _Experts(torch.bfloat16, "cuda")
    # a: TABLE's four keys (2200 tokens reach key 4096); c, untuned: the GEMV default, then
    # the grouped GEMM's three BLOCK_M defaults (run_zzz143 found 4 + 3 left from before the
    # GEMV default)
    assert moe_warmup.warm_up_moe(model, 2200, 1, torch.device("cuda")) == 4 + 4
    cases = []  # routed before arming: only the experts' kernels are watched
    for layer in (model.a, model.c):
        for n in (1, 7, 33, 100, 161, 555, 2177, 2200):
            x = torch.randn(n, 64, dtype=torch.bfloat16, device="cuda")
            logits = torch.randn(n, layer.w13.shape[0], device="cuda")
            cases.append((x, layer.w13, layer.w2, *torch.ops.loom.route_topk(logits, 2, True)))
    torch.cuda.synchronize()
    jit_watch.arm()
    try:
        before = len(jit_watch.compiles())
        outs = [fm.fused_moe(*case) for case in cases]
        torch.cuda.synchronize()
        assert jit_watch.compiles()[before:] == []
    finally:
        jit_watch.disarm()
    for case, out in zip(cases, outs):
        torch.testing.assert_close(out.float(), fm.moe_reference(*case).float(),
                                   rtol=3e-2, atol=3e-2)


def test_fp8_experts_are_a_shape_of_their_own(tuned, monkeypatch):
    """A layer with fp8 experts compiles beside a same-shaped unquantized one: its tokens
    in the model's dtype, its scales and block passed along, its config from the
    unquantized table (no fp8 one here)."""
    fp8 = tuned.a
    for name in ("w13", "w2"):
        weight = getattr(fp8, name)
        setattr(fp8, name, torch.nn.Parameter(weight.to(torch.float8_e4m3fn),
                                               requires_grad=False))
        setattr(fp8, name + "_scale", torch.nn.Parameter(torch.ones(*weight.shape[:2], 1),
                                                         requires_grad=False))
    asked = []

    def record(hidden, w13, w2, weights, ids, cfg, **quant):
        asked.append((hidden.dtype, w13.dtype, quant["w13_scale"] is fp8.w13_scale,
                      quant["w2_scale"] is fp8.w2_scale, cfg["GEMV"]))
    monkeypatch.setattr(fm, "compile_fused_moe", record)
    # c's untuned shape: the GEMV up to 2 tokens, then the grouped GEMM
    assert moe_warmup.warm_up_moe(tuned, 32, 1, torch.device("cpu")) == 4
    assert (torch.float32, torch.float8_e4m3fn, True, True, 1) in asked  # TABLE's key 1
    assert sum(dtype == torch.float32 for _, dtype, *_ in asked) == 3
