"""`--config FILE` on any command (vLLM's): a YAML mapping of the command's options, by
their long names (`max_model_len` or `max-model-len`), read as if they were given on the
command line before the others, so that a flag given there wins. true turns a flag on
(`--no-` form where it has one for false); lists go to options taking several values, else
as JSON, as do mappings (`compilation_config: {level: 3}`); `model` is serve's `--model`,
which a positional MODEL overrides. An option the command lacks, or a file that is not a
mapping, is a ValueError naming it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def expand_config(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """argv with its `--config FILE` replaced by the file's options, placed right after the
    (sub)command's name."""
    index = next((i for i, a in enumerate(argv) if a == "--config" or a.startswith("--config=")),
                 None)
    if index is None:
        return argv
    if argv[index] == "--config":
        if index + 1 >= len(argv):
            raise ValueError("config: --config needs a YAML file")
        path, rest = argv[index + 1], argv[:index] + argv[index + 2:]
    else:
        path, rest = argv[index].split("=", 1)[1], argv[:index] + argv[index + 1:]
    command, depth = _command_parser(parser, rest)
    options = _read(path)
    return rest[:depth] + _as_args(options, command, " ".join(rest[:depth])) + rest[depth:]


def _command_parser(parser: argparse.ArgumentParser,
                    argv: list[str]) -> tuple[argparse.ArgumentParser, int]:
    """The parser of the (sub)command argv names, and how many words name it."""
    depth = 0
    while True:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers or depth >= len(argv) or argv[depth] not in subparsers[0].choices:
            return parser, depth
        parser = subparsers[0].choices[argv[depth]]
        depth += 1


def _read(path: str) -> dict[str, Any]:
    import yaml
    try:
        with open(path, encoding="utf-8") as f:
            options = yaml.safe_load(f)
    except OSError as e:
        raise ValueError(f"config: cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        said = " ".join(str(e).split())  # one line
        raise ValueError(f"config: {path} is not valid YAML ({said})") from None
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"config: {path} must hold a mapping of options, got "
                         f"{type(options).__name__}")
    return options


def _as_args(options: dict[str, Any], parser: argparse.ArgumentParser, command: str
             ) -> list[str]:
    actions = parser._option_string_actions
    args: list[str] = []
    for key, value in options.items():
        flag = "--" + str(key).replace("_", "-")
        action = actions.get(flag)
        if action is None or flag == "--config":
            raise ValueError(f"config: {key!r} is not an option of loom {command}")
        if value is None:
            continue
        if isinstance(value, bool):
            if isinstance(action, argparse.BooleanOptionalAction):
                args.append(flag if value else "--no-" + flag[2:])
            elif action.nargs == 0:  # store_true / store_false
                if value != isinstance(action, argparse._StoreFalseAction):
                    args.append(flag)
            else:
                args += [flag, str(value).lower()]
        elif isinstance(value, list) and action.nargs in ("+", "*"):
            args += [flag, *(_text(v) for v in value)]
        else:
            args += [flag, _text(value)]
    return args


def _text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)
