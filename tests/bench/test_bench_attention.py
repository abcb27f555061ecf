"""`loom bench attention` on a tiny attention shape: in Triton's interpreter on the CPU (with
CUDA, the same runs compiled). The bytes and FLOPs each row is judged by are recomputed here
from the shapes, and a corrupted kernel output is an error, never a timing."""

from __future__ import annotations

import json
import os
import sys

import torch

# As tests/kernels/test_paged_attention.py: the interpreter must be chosen before triton is
# imported (tests/conftest.py has already done so for the session).
os.environ.setdefault("TRITON_INTERPRET", "0" if torch.cuda.is_available() else "1")

import pytest  # noqa: E402

pytest.importorskip("triton")

from loom.bench import attention as bench  # noqa: E402
from loom.bench import ceilings as ceilings_module  # noqa: E402
from loom.bench.ceilings import Ceilings  # noqa: E402
from loom.cli import main  # noqa: E402
from loom.kernels.paged_decode import default_num_splits  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
F32 = 4
FAKE = Ceilings(device="fake", copy_tb_per_s=1e-3, matmul_tflop_per_s=2e-3)
"""1 GB/s and 2 GFLOP/s: floors the test can recompute."""


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
                                "head_dim": HEAD_DIM, "hidden_size": 32}))
    return str(path)


@pytest.fixture
def fake_ceilings(monkeypatch):
    monkeypatch.setattr(ceilings_module, "measure_ceilings", lambda device, **kw: FAKE)


def _run(monkeypatch, *argv: str) -> int:
    argv = ("bench", "attention", "--dtype", "float32", "--block-size", "16",
            "--num-iters-warmup", "0", "--num-iters", "1", *argv)
    monkeypatch.setattr(sys, "argv", ["loom", *argv])
    return main(list(argv))


def _kv_bytes(seq_len: int) -> int:
    return seq_len * 2 * KV_HEADS * HEAD_DIM * F32


def _q_out_bytes(tokens: int) -> int:
    return 2 * tokens * HEADS * HEAD_DIM * F32


def test_decode_rows_bytes_and_floor(model, tmp_path, monkeypatch, fake_ceilings, capsys):
    out = tmp_path / "decode.json"
    assert _run(monkeypatch, "--model", model, "--batch-sizes", "2", "3", "--context-lens",
                "20", "33", "--output-json", str(out)) == 0
    r = json.loads(out.read_text())
    assert (r["num_heads"], r["num_kv_heads"], r["head_dim"]) == (HEADS, KV_HEADS, HEAD_DIM)
    assert r["command"].startswith("loom bench attention") and r["ceilings"]["device"] == "fake"
    assert [(row["batch_size"], row["context_len"]) for row in r["rows"]] == [
        (2, 20), (3, 20), (2, 33), (3, 33)]
    for row in r["rows"]:
        b, ctx = row["batch_size"], row["context_len"]
        assert row["us"] > 0 and row["max_rel_error"] <= 1e-4
        assert row["bytes"] == b * _kv_bytes(ctx) + _q_out_bytes(b) and row["flops"] == 0
        assert row["floor_us"] == pytest.approx(row["bytes"] / 1e9 * 1e6)
        assert row["ratio_to_floor"] == pytest.approx(row["us"] / row["floor_us"])
        assert row["gbps"] == pytest.approx(row["bytes"] / row["us"] / 1e3)
        (launch,) = row["launches"]  # what the backend itself launched
        assert launch["kernel"] == "paged_decode" and not launch["indexed"]
        assert launch["num_reqs"] == b
        assert launch["num_splits"] == default_num_splits(b, KV_HEADS, ctx, launch["block_n"])
    assert "x floor" in capsys.readouterr().out


def test_mixed_times_the_split_path_and_the_single_launch(model, tmp_path, monkeypatch,
                                                          fake_ceilings):
    out = tmp_path / "mixed.json"
    assert _run(monkeypatch, "--model", model, "--mode", "mixed", "--batch-sizes", "2", "3",
                "--context-lens", "20", "--prompt-tokens", "24", "--chunk-len", "16",
                "--chunk-context", "5", "--output-json", str(out)) == 0
    r = json.loads(out.read_text())
    assert "matmul rate" in r["floor"]
    assert len(r["rows"]) == 2
    chunks = [(16, 21), (8, 13)]  # (query_len, seq_len): 24 tokens in chunks of 16, after 5
    flops = 4 * HEADS * HEAD_DIM * sum(q * (s - q) + q * (q + 1) // 2 for q, s in chunks)
    for row, b in zip(r["rows"], (2, 3)):
        assert row["batch_size"] == b and row["num_tokens"] == b + 24
        assert [(c["query_len"], c["seq_len"]) for c in row["prompt_chunks"]] == chunks
        assert row["bytes"] == (b * _kv_bytes(20) + sum(_kv_bytes(s) for _, s in chunks)
                                + _q_out_bytes(b + 24))
        assert row["flops"] == flops
        floor_us = (row["bytes"] / 1e9 + flops / 2e9) * 1e6
        single = row["single_launch"]
        for timed in (row, single):
            assert timed["us"] > 0 and timed["max_rel_error"] <= 1e-4
            assert timed["floor_us"] == pytest.approx(floor_us)
            assert timed["ratio_to_floor"] == pytest.approx(timed["us"] / floor_us)
        assert row["speedup_over_single_launch"] == pytest.approx(single["us"] / row["us"])
        assert row["split_by_default"] is False  # 2 or 3 decodes: below the default count
        # The backend split the step: the decodes and the chunks, each over its own requests.
        decode, prefill = row["launches"]
        assert (decode["kernel"], decode["num_reqs"], decode["indexed"]) == (
            "paged_decode", b, True)
        assert (prefill["kernel"], prefill["num_reqs"], prefill["max_query_len"],
                prefill["indexed"]) == ("paged_prefill", 2, 16, True)
        (old,) = single["launches"]
        assert (old["kernel"], old["num_reqs"], old["max_query_len"]) == (
            "paged_prefill", b + 2, 16)


def test_verify_times_the_split_k_path_and_the_single_launch(model, tmp_path, monkeypatch,
                                                             fake_ceilings):
    """B queries of 1 + k tokens after context: the backend's split-K decode launch at
    q_tokens beside the varlen launch it took before, both checked and judged by the
    recomputed bytes and FLOPs."""
    out = tmp_path / "verify.json"
    assert _run(monkeypatch, "--model", model, "--mode", "verify", "--batch-sizes", "1", "3",
                "--context-lens", "20", "--query-len", "5", "--output-json", str(out)) == 0
    r = json.loads(out.read_text())
    assert [(row["batch_size"], row["context_len"]) for row in r["rows"]] == [(1, 20), (3, 20)]
    for row, b in zip(r["rows"], (1, 3)):
        flops = b * 4 * HEADS * HEAD_DIM * (5 * 20 + 5 * 6 // 2)
        assert row["num_tokens"] == 5 * b and row["flops"] == flops
        assert row["bytes"] == b * _kv_bytes(25) + _q_out_bytes(5 * b)
        floor_us = (row["bytes"] / 1e9 + flops / 2e9) * 1e6
        single = row["single_launch"]
        for timed in (row, single):
            assert timed["us"] > 0 and timed["max_rel_error"] <= 1e-4
            assert timed["floor_us"] == pytest.approx(floor_us)
        (launch,) = row["launches"]
        assert (launch["kernel"], launch["num_reqs"], launch["indexed"], launch["q_tokens"]) \
            == ("paged_decode", b, False, 8)
        (old,) = single["launches"]
        assert (old["kernel"], old["num_reqs"], old["max_query_len"]) == ("paged_prefill", b, 5)


def test_tune_sweeps_the_grid_and_checks_its_winner(model, tmp_path, monkeypatch):
    out = tmp_path / "tune.json"
    assert _run(monkeypatch, "--model", model, "--batch-sizes", "3", "--context-lens", "33",
                "--tune", "--tune-block-n", "16", "64", "--tune-warps", "4", "--tune-stages",
                "2", "--tune-splits", "2", "--output-json", str(out)) == 0
    (row,) = json.loads(out.read_text())["rows"]
    tuned = row["tuned"]
    assert row["floor_us"] is None and tuned["ratio_to_floor"] is None  # no ceilings on CPU
    # block_n 16: default_num_splits' 3 and 2; block_n 64: one tile, so only its default 1
    # (2 splits would leave one empty). The last is the backend's own choice.
    grid = [(16, 2), (16, 3), (64, 1)]
    assert sorted((c["config"]["block_n"], c["config"]["num_splits"])
                  for c in tuned["top"]) == grid
    assert tuned["searched"] == 3 and not tuned["skipped"] and not tuned["rejected"]
    assert tuned["us"] == min(c["us"] for c in tuned["top"]) and tuned["max_rel_error"] <= 1e-4
    assert tuned["speedup"] == pytest.approx(row["us"] / tuned["us"])


def test_prefill_mode_times_prompt_chunks_alone_and_tunes_their_tiles(
        model, tmp_path, monkeypatch, fake_ceilings):
    out = tmp_path / "prefill.json"
    assert _run(monkeypatch, "--model", model, "--mode", "prefill", "--prompt-tokens", "88",
                "--chunk-len", "16", "--chunk-context", "0", "7", "--tune",
                "--tune-prefill-block-m", "16", "32", "--tune-prefill-block-n", "16",
                "--tune-prefill-warps", "4", "--tune-prefill-stages", "1", "2",
                "--tune-prefill-mask-all", "0", "1", "--output-json", str(out)) == 0
    r = json.loads(out.read_text())
    assert len(r["rows"]) == 2  # one per chunk context
    for row, before in zip(r["rows"], (0, 7)):
        chunks = [(16, before + 16)] * 5 + [(8, before + 8)]
        assert row["batch_size"] == 0 and row["num_tokens"] == 88
        assert [(c["query_len"], c["seq_len"]) for c in row["prompt_chunks"]] == chunks
        flops = 4 * HEADS * HEAD_DIM * sum(q * (s - q) + q * (q + 1) // 2 for q, s in chunks)
        assert row["flops"] == flops
        assert row["bytes"] == sum(_kv_bytes(s) for _, s in chunks) + _q_out_bytes(88)
        assert row["floor_us"] == pytest.approx((row["bytes"] / 1e9 + flops / 2e9) * 1e6)
        assert row["tflops"] == pytest.approx(flops / row["us"] / 1e6)
        # The six chunks take one unindexed launch of the varlen kernel (more requests than
        # go to SDPA).
        (launch,) = row["launches"]
        assert (launch["kernel"], launch["num_reqs"], launch["max_query_len"],
                launch["indexed"]) == ("paged_prefill", 6, 16, False)
        tuned = row["tuned"]
        # 2 x 2 tiles, each with its interior tiles unmasked and with every tile masked
        assert tuned["searched"] == 8 and not tuned["skipped"] and not tuned["rejected"]
        assert len(tuned["top"]) == 5 and all(c["config"]["block_n"] == 16
                                              for c in tuned["top"])
        assert tuned["max_rel_error"] <= 1e-4


@pytest.mark.parametrize("unwritten", [False, True], ids=["wrong-row", "unwritten"])
def test_a_corrupted_output_is_an_error_not_a_timing(model, tmp_path, monkeypatch, capsys,
                                                     unwritten):
    from loom.attention import triton_backend
    real = triton_backend.paged_decode

    def garbage(query, kv_cache, out, *args, **kwargs):
        if unwritten:  # whatever the fresh output held stays there
            return out
        real(query, kv_cache, out, *args, **kwargs)
        out[1] += 0.5  # one request's row
        return out

    monkeypatch.setattr(triton_backend, "paged_decode", garbage)
    out = tmp_path / "bad.json"
    assert _run(monkeypatch, "--model", model, "--batch-sizes", "2", "--context-lens", "20",
                "--output-json", str(out)) == 2
    assert "disagrees with the torch reference" in capsys.readouterr().err
    assert not out.exists()


def test_without_a_gpu_or_the_interpreter_it_says_so(model, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(bench, "_interpreted", lambda: False)
    assert _run(monkeypatch, "--model", model) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "TRITON_INTERPRET=1" in err


@pytest.mark.parametrize("flags, message", [
    (["--mode", "mixed", "--tune"], "tune: sweeps one kernel's tiles"),
    (["--mode", "verify", "--query-len", "9"], "verify: query_len must be 2 to 8 tokens"),
    (["--mode", "prefill", "--chunk-len", "1"], "prefill: prompt_tokens, chunk_len"),
    (["--batch-sizes", "0"], "batch_sizes: must be positive"),
    (["--block-size", "24"], "block_size: must be a positive power of two"),
    (["-tp", "3"], "tensor_parallel_size: 3 does not divide"),
])
def test_bad_flags_are_clear_errors(model, monkeypatch, capsys, flags, message):
    assert _run(monkeypatch, "--model", model, *flags) == 2
    assert message in capsys.readouterr().err


def test_shipped_shapes_per_rank():
    assert bench.attention_shape("llama-3.1-8b", 1) == bench.AttentionShape(32, 8, 128)
    assert bench.attention_shape("llama-3.1-8b", 2) == bench.AttentionShape(16, 4, 128)
    assert bench.attention_shape("llama-3.1-70b", 8) == bench.AttentionShape(8, 1, 128)
    # One 8B token's keys and values are 4 KiB per layer (128 KiB over its 32 layers).
    step = bench.decode_step(430, 1200)
    per_token = 2 * 8 * 128 * 2
    assert per_token * 32 == 128 << 10
    assert bench.step_bytes(step, bench.attention_shape("llama-3.1-8b", 1), 2) == (
        430 * 1200 * per_token + 2 * 430 * 32 * 128 * 2)


def test_fp8_cache_halves_the_kv_bytes(model, tmp_path, monkeypatch, fake_ceilings):
    out = tmp_path / "fp8.json"
    assert _run(monkeypatch, "--model", model, "--batch-sizes", "2", "--context-lens", "20",
                "--kv-cache-dtype", "fp8", "--output-json", str(out)) == 0
    r = json.loads(out.read_text())
    assert r["kv_cache_dtype"] == "float8_e4m3fn"
    (row,) = r["rows"]
    # one byte a cached element; the float32 queries and outputs as they are
    assert row["bytes"] == 2 * _kv_bytes(20) // F32 + _q_out_bytes(2)
    assert row["max_rel_error"] < 1e-4  # against the reference over the same 8-bit cache
