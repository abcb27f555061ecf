"""vLLM's ways of giving the compilation config on the command line, folded into one
`--compilation-config <json>` before argparse sees them:

    -O3  -O 3  -O=3                          a bare level
    -O '{"level": 3, "compile_sizes": [8]}'  a JSON object
    -O.cudagraph_mode=NONE                   one key (its value JSON, else a string)
    -cc.pass_config.enable_async_tp true     a nested key, the value as the next argument
    -O.compile_sizes+ 8 -O.compile_sizes+=16,32   list items, appended

`-O`, `-cc` and `--compilation-config` are one flag. Every occurrence merges, in order,
into one object; a key given twice keeps its later value, and says so in one line."""

from __future__ import annotations

import json
import logging
from typing import Any

from loom.config import compilation_dict

logger = logging.getLogger(__name__)

FLAGS = ("--compilation-config", "-cc", "-O")


def fold_compilation_flags(argv: list[str]) -> list[str]:
    """argv with every compilation-config flag replaced by one `--compilation-config`,
    where the first stood; unchanged where there is none. A bad value is a ValueError
    naming the flag."""
    out: list[str] = []
    pieces: list[tuple[str, list[str], str]] = []
    first, i = None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":  # what follows is positional
            out.extend(argv[i:])
            break
        hit = _split(arg) if arg.startswith("-") else None
        if hit is None:
            out.append(arg)
            i += 1
            continue
        flag, path, value = hit
        if value is None:
            if i + 1 >= len(argv):
                raise ValueError(f"{arg}: expected a value")
            value, i = argv[i + 1], i + 2
        else:
            i += 1
        first = len(out) if first is None else first
        pieces.append((flag, path, value))
    if first is None:
        return argv
    if len(pieces) == 1 and not pieces[0][1]:  # one whole value: parsed, and refused, later
        text = pieces[0][2]
    else:
        text = json.dumps(_merge(pieces))
    return out[:first] + ["--compilation-config", text] + out[first:]


def _split(arg: str) -> tuple[str, list[str], str | None] | None:
    """(flag, dotted key path, value given in arg or None) for a compilation-config flag."""
    for flag in FLAGS:
        if arg == flag:
            return flag, [], None
        if not arg.startswith(flag):
            continue
        rest = arg[len(flag):]
        if rest.startswith("="):
            return flag, [], rest[1:]
        if rest.startswith("."):
            key, eq, value = rest[1:].partition("=")
            return flag, key.split("."), value if eq else None
        if flag == "-O":  # -O3, -O{...}
            return flag, [], rest
    return None


def _merge(pieces: list[tuple[str, list[str], str]]) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for flag, path, text in pieces:
        if not path:
            for key, value in compilation_dict(text).items():
                _put(config, [key], value)
            continue
        append = path[-1].endswith("+")
        path = [*path[:-1], path[-1].removesuffix("+")]
        if not all(path):
            raise ValueError(f"{flag}.{'.'.join(path)}: a dotted key has an empty part")
        value = [_value(v) for v in text.split(",")] if append else _value(text)
        _put(config, path, value, append)
    return config


def _value(text: str) -> Any:
    """As vLLM reads a dotted key's value: JSON where it parses (3, true, [1, 2]), else the
    text itself (NONE)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _put(config: dict[str, Any], path: list[str], value: Any, append: bool = False) -> None:
    node = config
    for depth, key in enumerate(path[:-1]):
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ValueError(f"compilation_config.{'.'.join(path[:depth + 1])}: is not an "
                             f"object, so it has no key {path[depth + 1]!r}")
    leaf, name = path[-1], "compilation_config." + ".".join(path)
    old = node.get(leaf)
    if append and isinstance(old, list):
        node[leaf] = old + value
        return
    if isinstance(old, dict) and isinstance(value, dict):
        for key, inner in value.items():
            _put(config, [*path, key], inner)
        return
    if leaf in node and old != value:
        logger.warning("%s given twice: %r, then %r; the later one is used", name, old, value)
    node[leaf] = value
