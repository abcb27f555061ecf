"""vLLM's spellings of `-O` on the command line (its docs' "JSON CLI arguments" tip: a
dotted key equals the same key inside the JSON object; `key+` appends list items), each
checked against the plain JSON object that json, not loom, parses."""

from __future__ import annotations

import json
import logging

import pytest

from loom.config import CompilationConfig


def _config(*flags: str) -> CompilationConfig:
    from loom.cli import build_parser
    args = build_parser().parse_args(["generate", "--prompt", "x", *flags])
    return CompilationConfig.parse(args.compilation_config)


def _json(obj: dict) -> CompilationConfig:
    return CompilationConfig.parse(json.dumps(obj))


@pytest.mark.parametrize("flags, same_as", [
    (["-O3"], {"level": 3}),
    (["-O", "3"], {"level": 3}),
    (["-O=3"], {"level": 3}),
    (["-cc", "2"], {"level": 2}),
    (["-O3", "-O.cudagraph_mode=NONE"], {"level": 3, "cudagraph_mode": "NONE"}),
    (["-O.mode", "3", "-cc.pass_config.enable_async_tp", "true"],
     {"mode": 3, "pass_config": {"enable_async_tp": True}}),
    (["--compilation-config.compile_sizes+", "8", "-O.compile_sizes+=16,32", "-O.level=3"],
     {"level": 3, "compile_sizes": [8, 16, 32]}),
    (["-O.compile_sizes+", "cudagraph_capture_sizes", "-O.compile_sizes+=64"],
     {"compile_sizes": ["cudagraph_capture_sizes", 64]}),
    (["-O", '{"level": 3, "compile_sizes": [4]}', "-O.splitting_ops=[]"],
     {"level": 3, "compile_sizes": [4], "splitting_ops": []}),
    (["-O", '{"pass_config": {"enable_noop": false}}', "-O.pass_config.enable_async_tp=true",
      "-O3"], {"level": 3, "pass_config": {"enable_noop": False, "enable_async_tp": True}}),
    (["-O.mode=VLLM_COMPILE", "-O.cudagraph_mode=piecewise", "-O.pass_config.enable_sp=true",
      "-O.max_cudagraph_capture_size=16"],
     {"mode": 3, "cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 16,
      "pass_config": {"enable_sequence_parallelism": True}}),
])
def test_vllms_spellings_equal_the_json_object(flags, same_as):
    assert _config(*flags) == _json(same_as)


def test_the_folded_flag_may_sit_anywhere_among_the_others():
    from loom.cli import build_parser
    args = build_parser().parse_args(["generate", "-O.cudagraph_mode=NONE", "--prompt", "x",
                                      "-O3", "--max-tokens", "5"])
    assert args.prompt == ["x"] and args.max_tokens == 5
    assert CompilationConfig.parse(args.compilation_config) == _json(
        {"level": 3, "cudagraph_mode": "NONE"})


def test_a_key_given_twice_keeps_the_later_value_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="loom.engine.json_flags"):
        assert _config("-O3", "-O.level=2").level == 2
    assert caplog.messages == [
        "compilation_config.level given twice: 3, then 2; the later one is used"]


@pytest.mark.parametrize("flags, message", [
    (["-O.level"], "-O.level: expected a value"),
    (["-O.=3", "-O3"], "-O.: a dotted key has an empty part"),
    (["-O.pass_config=1", "-O.pass_config.enable_noop=true"],
     "compilation_config.pass_config: is not an object, so it has no key 'enable_noop'"),
    (["-O{oops", "-O.level=3"], "compilation_config: not valid JSON"),
    (["-O3", "-O.mode=2"], "level 3 and mode 2 differ"),
    (["-O.cudagraph_mode=PIECES", "-O3"], "compilation_config.cudagraph_mode: must be one of"),
    (["-cc.no_such_field=1", "-O3"], "compilation_config: unknown field(s) ['no_such_field']"),
])
def test_bad_spellings_are_one_line_cli_errors(capsys, flags, message):
    from loom.cli import main
    try:
        code = main(["generate", "--model", "llama-3.1-8b", "--load-format", "dummy",
                     "--prompt", "x", *flags])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err
