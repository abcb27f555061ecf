"""The fused MoE's tile configs (loom/kernels/moe_config.py): the GROUP_M launch order,
non-default tiles against the reference (Triton's CPU interpreter), the tuned-file lookup,
and `loom bench moe` off CUDA."""

import json
import os
import zlib

import torch

os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from loom.kernels import fused_moe as fm
from loom.kernels import moe_config as mc
from loom.kernels import moe_gemm

INTERPRET = isinstance(moe_gemm._down_kernel, InterpretedFunction)
cpu_only = pytest.mark.skipif(not INTERPRET, reason="CPU checks need TRITON_INTERPRET=1")


@pytest.fixture(autouse=True)
def _seed(request):
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def make_moe(tokens, hidden, inter, experts, top_k):
    x = torch.randn(tokens, hidden)
    w13 = torch.randn(experts, 2 * inter, hidden) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter) / inter ** 0.5
    weights, ids = torch.softmax(torch.randn(tokens, experts), dim=-1).topk(top_k, dim=-1)
    return x, w13, w2, weights / weights.sum(dim=-1, keepdim=True), ids


@triton.jit
def _order_kernel(out_ptr, num_row_blocks, NUM_COL_TILES: tl.constexpr, GROUP_M: tl.constexpr):
    pid_m, pid_n = moe_gemm._tile_ids(num_row_blocks, NUM_COL_TILES, GROUP_M)
    tl.store(out_ptr + 2 * tl.program_id(0), pid_m)
    tl.store(out_ptr + 2 * tl.program_id(0) + 1, pid_n)


def launch_order(rows, cols, group_m):
    out = torch.full((rows * cols, 2), -1, dtype=torch.int32)
    _order_kernel[(rows * cols,)](out, rows, NUM_COL_TILES=cols, GROUP_M=group_m)
    return [tuple(p) for p in out.tolist()]


@cpu_only
@pytest.mark.parametrize("rows,cols,group_m", [(9, 3, 1), (9, 3, 2), (9, 3, 4), (5, 2, 8)])
def test_tile_order_visits_every_tile_once(rows, cols, group_m):
    order = launch_order(rows, cols, group_m)
    assert sorted(order) == [(m, n) for m in range(rows) for n in range(cols)]
    if group_m == 1:  # the former 2-D grid's order: every row block of a column tile in turn
        assert order == [(m, n) for n in range(cols) for m in range(rows)]
    else:  # GROUP_M row blocks sweep all column tiles before the next group starts
        for i, (m, _) in enumerate(order):
            group = m // group_m
            assert i // (group_m * cols) == group
        assert order[:2] == [(0, 0), (1, 0)]


# tokens=40, experts=4, top_k=2: 80 slots, 9 row blocks of 16 (a ragged last group for
# GROUP_M 2 and 4), 3 gate_up and 2 down column tiles of 16.
CONFIGS = {
    "group2": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2},
    "group4-wide": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 16, "GROUP_M": 4,
                    "num_warps": 8, "num_stages": 4},
    "group-over-all": {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 16,
                       "num_stages": 2},
    "vllm-names": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 32,
                   "GROUP_SIZE_M": 3},
}


@cpu_only
@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_configs_match_reference(config):
    x, w13, w2, weights, ids = make_moe(40, 32, 48, 4, 2)
    out = fm.fused_moe(x, w13, w2, weights, ids, config=config)
    torch.testing.assert_close(out, fm.moe_reference(x, w13, w2, weights, ids),
                               atol=1e-4, rtol=1e-4)


def test_default_config_decode_takes_the_gemv():
    # half a row an expert or less: the GEMV kernels; more: the former fixed tiles
    gemm = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4,
            "num_stages": 3, "GEMV": 0, "TMA": 0}
    for tokens in (1, 8):
        assert mc.default_config(tokens, 8, 128, torch.bfloat16) == {
            **gemm, "BLOCK_N": 8, "BLOCK_K": 512, "GEMV": 1}
    assert mc.default_config(9, 8, 128, torch.bfloat16) == gemm
    assert mc.default_config(1025, 8, 128, torch.bfloat16)["BLOCK_M"] == 64
    assert mc.default_config(512, 8, 128, torch.float16)["BLOCK_M"] == 32
    fp32 = mc.default_config(4, 2, 8, torch.float32)
    assert (fp32["BLOCK_N"], fp32["BLOCK_K"], fp32["GEMV"]) == (32, 32, 0)


def test_a_partial_config_fills_in_the_grouped_gemm():
    """A config without GEMV means the grouped GEMM, even at decode sizes."""
    got = mc.get_config(1, 8, 128, 768, torch.bfloat16, "cpu", config={"BLOCK_N": 32})
    assert got == {**mc.gemm_defaults(1, 8, 128, torch.bfloat16), "BLOCK_N": 32}
    assert got["GEMV"] == 0


@pytest.mark.parametrize("bad, message", [
    ({"BLOCK_Q": 16}, "unknown key"),
    ({"BLOCK_M": 24}, "power of two"),
    ({"BLOCK_K": 8}, "power of two"),
    ({"num_warps": 0}, "positive"),
    ({"GEMV": 2}, "0 or 1"),
    ({"TMA": 2}, "TMA must be 0 or 1"),
    ({"GEMV": 1, "TMA": 1, "BLOCK_N": 8}, "not to GEMV"),
    ({"BLOCK_N": 8}, "power of two >= 16"),
    ({"GEMV": 1, "BLOCK_N": 6}, "power of two >= 1"),
])
def test_bad_configs_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        mc.normalize_config(bad)


# -- the tuned-file lookup -----------------------------------------------------------------
def _tile(bm, group=1):
    return {"BLOCK_M": bm, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": group, "num_warps": 4,
            "num_stages": 2}


TABLE = {"1": _tile(16), "16": _tile(16, 2), "64": _tile(32, 4), "1024": _tile(64, 8)}


@pytest.fixture
def config_dir(tmp_path, monkeypatch):
    """A tuned file for E=4, N=48, float32 on the CPU in a fresh LOOM_MOE_CONFIG_DIR."""
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    name = mc.config_file_name(4, 48, torch.float32, "cpu")
    (tmp_path / name).write_text(json.dumps(TABLE))
    return tmp_path


def lookup(tokens, experts=4, inter=48, dtype=torch.float32):
    return mc.get_config(tokens, 2, experts, inter, dtype, "cpu")


def test_file_name():
    assert mc.config_file_name(128, 768, torch.bfloat16, "NVIDIA H200") == \
        "E=128,N=768,dtype=bfloat16,device_name=NVIDIA_H200.json"


@pytest.mark.parametrize("tokens, key", [
    (1, "1"), (8, "1"), (9, "16"),  # 8.5 is the midpoint: a tie goes to the smaller key
    (40, "16"), (41, "64"), (544, "64"), (545, "1024"), (100_000, "1024")])
def test_nearest_key_wins(config_dir, tokens, key):
    # TABLE, like files tuned before the GEMV and TMA keys existed, leaves both out
    assert lookup(tokens) == {**TABLE[key], "GEMV": 0, "TMA": 0}


def test_single_entry_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    (tmp_path / mc.config_file_name(4, 48, torch.float32, "cpu")).write_text(
        json.dumps({"64": {"BLOCK_M": 32}}))
    # Keys a file leaves out come from the defaults.
    assert lookup(1) == {**mc.gemm_defaults(1, 2, 4, torch.float32), "BLOCK_M": 32}


def test_no_file_means_the_defaults(config_dir):
    for tokens in (1, 40, 5000):
        for other in ({"experts": 8}, {"inter": 32}, {"dtype": torch.bfloat16}):
            assert lookup(tokens, **other) == mc.default_config(
                tokens, 2, other.get("experts", 4), other.get("dtype", torch.float32))


def test_an_untuned_gpu_says_so_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(mc, "device_name", lambda device: "Untuned_GPU")
    with caplog.at_level("INFO", logger="loom.kernels.moe_config"):
        for _ in range(3):
            assert mc._tuned_table(4, 48, torch.bfloat16, torch.device("cuda")) is None
        mc._tuned_table(4, 48, torch.bfloat16, torch.device("cpu"))  # the CPU: never tuned
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "E=4,N=48,dtype=bfloat16,device_name=Untuned_GPU.json" in lines[0]
    assert "loom bench moe --tune" in lines[0]


def test_default_directory_has_no_cpu_file(monkeypatch):
    monkeypatch.delenv("LOOM_MOE_CONFIG_DIR", raising=False)
    from loom.kernels.tuned import CONFIG_DIR
    assert mc.config_dir() == CONFIG_DIR
    assert lookup(40) == mc.default_config(40, 2, 4, torch.float32)


def test_a_broken_file_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOM_MOE_CONFIG_DIR", str(tmp_path))
    (tmp_path / mc.config_file_name(4, 48, torch.float32, "cpu")).write_text(
        json.dumps({"16": {"BLOCK_M": 20}}))
    with pytest.raises(ValueError, match="config file .*power of two"):
        lookup(16)


@pytest.fixture
def align_block_sizes(monkeypatch) -> list[int]:
    """The block_m of every moe_align call, in order."""
    seen = []
    real_align = moe_gemm.moe_align

    def spy(topk_ids, num_experts, block_m):
        seen.append(block_m)
        return real_align(topk_ids, num_experts, block_m)

    monkeypatch.setattr(moe_gemm, "moe_align", spy)
    return seen


@cpu_only
def test_fused_moe_uses_the_file_and_explicit_tiles_override_it(config_dir, align_block_sizes):
    seen = align_block_sizes
    x, w13, w2, weights, ids = make_moe(40, 32, 48, 4, 2)
    ref = fm.moe_reference(x, w13, w2, weights, ids)
    for kwargs in ({}, {"block_m": 32}, {"config": _tile(64)}):
        out = fm.fused_moe(x, w13, w2, weights, ids, **kwargs)
        torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    assert seen == [16, 32, 64]  # the file's "16" entry, then the overrides


def test_lookup_traces_whole_under_torch_compile(config_dir):
    """A tuned file is read while tracing, not in the graph: fullgraph holds, and each
    token count still gets its nearest key (through range guards)."""
    def f(x):
        config = mc.get_config(x.shape[0], 2, 4, 48, x.dtype, x.device)
        return x + config["BLOCK_M"] + config["GROUP_M"] / 10

    compiled = torch.compile(f, backend="eager", fullgraph=True, dynamic=True)
    for tokens, key in ((3, "1"), (20, "16"), (700, "1024")):
        x = torch.zeros(tokens)
        torch._dynamo.mark_dynamic(x, 0)
        want = TABLE[key]["BLOCK_M"] + TABLE[key]["GROUP_M"] / 10
        assert compiled(x)[0].item() == pytest.approx(want)


# -- loom bench moe ------------------------------------------------------------------------
def test_bench_moe_without_cuda_is_a_one_line_error(monkeypatch, capsys):
    from loom.cli import main
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "moe", "--model", "qwen3-30b-a3b", "--tune"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs a CUDA GPU" in err, err


@pytest.mark.parametrize("flags, message", [
    (["--model", "llama-3.1-8b"], "not a mixture-of-experts config"),
    (["--model", "no-such-model"], "is not a model directory"),
    (["-tp", "5"], "does not divide"),
    (["--batch-sizes", "0"], "must be positive"),
])
def test_bench_moe_flag_errors(flags, message, capsys):
    from loom.cli import main
    assert main(["bench", "moe", *flags]) == 2
    assert message in capsys.readouterr().err


def test_bench_moe_reads_the_expert_shapes():
    from loom.bench.moe_space import moe_shape, search_space
    shape = moe_shape("qwen3-30b-a3b", 2)
    assert (shape.hidden, shape.inter, shape.num_experts, shape.top_k) == (2048, 384, 128, 8)
    assert shape.flops(1) == 2 * 8 * (2048 * 2 * 384 + 384 * 2048)
    for tokens in (1, 256, 16384):
        space = search_space(shape, tokens)
        assert space and all(mc.normalize_config(c) == c for c in space)
    assert {c["BLOCK_M"] for c in search_space(shape, 1)} == {16}
    # the GEMV kernels where a token or two leave each expert a row at most
    assert {c["GEMV"] for c in search_space(shape, 1)} == {0, 1}
    assert {c["GEMV"] for c in search_space(shape, 64)} == {0}
    # TMA only where the GEMMs are compute-bound (128 rows an expert), every tile both ways
    assert {c["TMA"] for c in search_space(shape, 1024)} == {0}
    prompt = search_space(shape, 2048)
    assert [{**c, "TMA": 1} for c in prompt if not c["TMA"]] == [c for c in prompt if c["TMA"]]


@cpu_only
def test_the_op_picks_its_config_per_call_without_recompiling(config_dir, align_block_sizes):
    """torch.ops.loom.fused_moe is opaque to torch.compile: one graph for every token
    count, and each call still runs the config nearest its own count."""
    seen = align_block_sizes
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(lambda *a: torch.ops.loom.fused_moe(*a), backend=backend,
                             fullgraph=True, dynamic=True)
    for tokens in (3, 41, 545):
        x, w13, w2, weights, ids = make_moe(tokens, 32, 48, 4, 2)
        for t in (x, weights, ids):
            torch._dynamo.mark_dynamic(t, 0)
        out = compiled(x, w13, w2, weights, ids)
        torch.testing.assert_close(out, fm.moe_reference(x, w13, w2, weights, ids),
                                   atol=1e-4, rtol=1e-4)
    assert len(graphs) == 1
    assert seen == [16, 32, 64]  # the keys "1", "64" and "1024"


def test_tuning_some_sizes_keeps_the_files_other_entries(tmp_path):
    from loom.bench.moe import merged_table
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"1": _tile(16), "1024": _tile(64, 8)}))
    new = {**_tile(32, 4), "GEMV": 0, "TMA": 1}
    table = merged_table(path, [{"batch_size": 1024, "config": new},
                                {"batch_size": 64, "config": new}])
    assert list(table) == ["1", "64", "1024"]
    assert table["1"] == _tile(16) and table["64"] == table["1024"] == new
    assert merged_table(tmp_path / "none.json", [{"batch_size": 8, "config": new}]) == {"8": new}
