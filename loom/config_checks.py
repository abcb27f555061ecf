"""Validation helpers shared by the config dataclasses (`loom.config`,
`loom.compilation_config`): a failed check is a `ValueError` naming the field."""

from __future__ import annotations

import dataclasses
from typing import Any


def check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def from_dict(cls, data: dict[str, Any], where: str):
    """cls(**data), an unknown key refused with the known ones listed."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    check(not unknown, f"{where}: unknown field(s) {unknown}; known: {sorted(names)}")
    return cls(**data)
