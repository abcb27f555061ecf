"""Validation helpers shared by the config dataclasses (`loom.config`,
`loom.compilation_config`): a failed check is a `ValueError` naming the field."""

from __future__ import annotations

import dataclasses
import json
from typing import Any


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def check_bools(values: dict[str, Any], optional: bool = False) -> None:
    """Each value a bool (or None, where optional): a string such as "no" is truthy, so it
    would otherwise be read as true."""
    for name, value in values.items():
        if not isinstance(value, bool) and not (optional and value is None):
            raise ValueError(f"{name}: must be true{', false or None' if optional else ' or false'}"
                             f", got {value!r}")


def from_dict(cls, data: dict[str, Any], where: str):
    """cls(**data), an unknown key refused with the known ones listed."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    check(not unknown, f"{where}: unknown field(s) {unknown}; known: {sorted(names)}")
    return cls(**data)


def json_object(value: Any, where: str) -> dict[str, Any]:
    """A dict, or a JSON object's text (as a flag gives it), as a fresh dict of plain JSON
    values: it crosses to the engine and worker processes as JSON, so a value that JSON
    cannot carry (a function, a set) is refused here, naming the field."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"{where}: not valid JSON ({e}): {value!r}") from None
    check(not callable(value), f"{where}: a function is not taken (vLLM's Python-only form): "
                               "the config crosses to the engine process as JSON; pass a dict")
    check(isinstance(value, dict), f"{where}: expected a JSON object (a dict), got "
                                   f"{type(value).__name__}")
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: must hold only JSON values ({e})") from None


def name_list(value: Any, where: str, allow_types: bool = False) -> tuple:
    """None, one name, or a list of non-empty names (and classes, where allow_types), as a
    tuple: a flag's nargs list and a Python caller's list alike."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, str) else value
    ok = isinstance(items, list | tuple) and all(
        (isinstance(v, str) and v) or (allow_types and isinstance(v, type)) for v in items)
    check(ok, f"{where}: expected a list of {'classes or ' if allow_types else ''}names, got "
              f"{value!r}")
    return tuple(items)
