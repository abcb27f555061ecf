"""The scanner that streams tool calls, against Python's json: for random JSON objects
(strings with escapes, quotes and brackets inside, nesting, numbers, literals), read as
they grow piece by piece through one GrowingScan, every finished value's span parses to
json's value, and no unfinished value is reported finished."""

from __future__ import annotations

import json
import random

import pytest

from loom.entrypoints.openai.partial_json import GrowingScan, object_members, read_object

_TRICKY = ['a"b', "x\\y", "{[}]", "\\", '\\"', "é ü \n\t", "}", "\u2028", ""]


def _value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(6 if depth < 3 else 4)
    if kind == 0:
        return rng.choice(_TRICKY) + str(rng.random())
    if kind == 1:
        return rng.choice([rng.randrange(-1000, 1000), rng.random() * 1e6, True, False, None])
    if kind == 2:
        return "".join(rng.choice('ab"\\{}[] ,:') for _ in range(rng.randrange(30)))
    if kind == 3:
        return rng.choice(_TRICKY)
    if kind == 4:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}{rng.choice(_TRICKY)}": _value(rng, depth + 1) for i in range(rng.randrange(4))}


@pytest.mark.parametrize("seed", range(40))
def test_growing_text_agrees_with_json(seed):
    rng = random.Random(seed)
    obj = {f"m{i}": _value(rng) for i in range(rng.randrange(1, 5))}
    text = json.dumps(obj, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
    scan, cut = GrowingScan(), 0
    while cut < len(text):
        cut = min(len(text), cut + rng.randrange(1, 9))
        members = object_members(text[:cut], 0, scan)
        fresh = read_object(text[:cut], 0)
        assert members == fresh.members
        assert fresh.end == (len(text) if cut == len(text) else None)  # closed at its brace
        for key, (start, end) in members.items():
            if end is not None:
                assert json.loads(text[start:end]) == obj[key]
    assert set(members) == set(obj) and all(end is not None for _, end in members.values())


def test_not_an_object():
    assert object_members('["a"]', 0) is None
    assert object_members('{a: 1}', 0) is None
    assert object_members('{"a" 1}', 0) is None
