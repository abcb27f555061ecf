"""Where the members of a JSON object are in text that may still be growing: enough of a
JSON scanner to stream a tool call's name and arguments while the model writes them."""

from __future__ import annotations

import json

_CLOSE = {"{": "}", "[": "]"}


def object_members(text: str, start: int) -> dict[str, tuple[int, int | None]] | None:
    """key -> (start, end) of each value of the object at text[start] ('{'), end None for a
    value the text has not finished; None where the text is not such an object (so far)."""
    if text[start:start + 1] != "{":
        return None
    members: dict[str, tuple[int, int | None]] = {}
    i = _skip_space(text, start + 1)
    while i < len(text) and text[i] != "}":
        if text[i] == "," and members:
            i = _skip_space(text, i + 1)
        key_end = _string_end(text, i)
        if key_end is None:
            return members if i >= len(text) or text[i] == '"' else None
        colon = _skip_space(text, key_end)
        if colon >= len(text):
            return members
        if text[colon] != ":":
            return None
        value = _skip_space(text, colon + 1)
        if value >= len(text):
            return members
        end = _value_end(text, value)
        members[json.loads(text[i:key_end])] = (value, end)
        if end is None:
            return members
        i = _skip_space(text, end)
    return members


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """The index after the string starting at text[i] ('"'); None if unfinished or none."""
    if text[i:i + 1] != '"':
        return None
    i += 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return None


def _value_end(text: str, i: int) -> int | None:
    """The index after the value starting at text[i]; None if the text has not finished it."""
    if text[i] == '"':
        return _string_end(text, i)
    if text[i] not in _CLOSE:  # a number, true, false or null: ends at a delimiter
        j = i
        while j < len(text) and text[j] not in ",}] \t\r\n":
            j += 1
        return j if j < len(text) else None
    stack = [_CLOSE[text[i]]]
    i += 1
    while i < len(text):
        c = text[i]
        if c == '"':
            end = _string_end(text, i)
            if end is None:
                return None
            i = end
            continue
        if c in _CLOSE:
            stack.append(_CLOSE[c])
        elif c == stack[-1]:
            stack.pop()
            if not stack:
                return i + 1
        i += 1
    return None
