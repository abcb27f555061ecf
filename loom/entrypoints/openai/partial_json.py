"""Where the members of a JSON object are in text that may still be growing: enough of a
JSON scanner to stream a tool call's name and arguments while the model writes them.

A stream asks again at each new piece of text. A `GrowingScan` remembers how far each
value was read and goes on from there, so a call of n characters costs O(n) in all rather
than O(n) a piece; regular expressions jump over string contents and everything but
brackets. Other syntaxes (`partial_python`) keep their values in the same scan."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

_CLOSE = {"{": "}", "[": "]"}
_STRING_REST = re.compile(r'(?:[^"\\]+|\\.)*(?:(")|(\\?)\Z)', re.S)
"""A string's text after its opening quote: to its closing quote (group 1), or to the end of
the text (group 2: a lone backslash there, whose escape is not written yet)."""
_SIGNIFICANT = re.compile(r'["{}\[\]]')


class GrowingValue(Protocol):
    """A value being read from its start; `end` goes on from where the last call stopped."""

    def end(self, text: str) -> int | None: ...


class GrowingScan:
    """The ends of values in one text that only grows, each read from where it was left."""

    def __init__(self) -> None:
        self._values: dict[int, GrowingValue] = {}
        self._length = 0

    def value_end(self, text: str, i: int) -> int | None:
        """The index after the JSON value starting at text[i]; None if not finished yet."""
        return self.end_of(text, i, _Value)

    def end_of(self, text: str, i: int, kind: Callable[[int], GrowingValue]) -> int | None:
        """The index after the value of syntax kind starting at text[i]; None if not
        finished yet. A position is read as one kind only."""
        if len(text) < self._length:  # not the text this scan read: start over
            self._values.clear()
        self._length = len(text)
        value = self._values.get(i)
        if value is None:
            value = self._values[i] = kind(i)
        return value.end(text)


class _Value:
    def __init__(self, start: int) -> None:
        self.start, self.pos = start, start + 1
        self.stack: list[str] = []
        self.in_string = False
        self.done: int | None = None

    def end(self, text: str) -> int | None:
        if self.done is not None:
            return self.done
        first = text[self.start]
        if first not in _CLOSE and first != '"':  # a number, true, false or null
            return _scalar_end(text, self.start)
        if self.pos == self.start + 1:
            self.in_string = first == '"'
            self.stack = [_CLOSE[first]] if first in _CLOSE else []
        while True:
            if self.in_string:
                match = _STRING_REST.match(text, self.pos)
                if not match.group(1):
                    self.pos = match.end() - len(match.group(2))
                    return None
                self.pos, self.in_string = match.end(), False
                if not self.stack:
                    self.done = self.pos
                    return self.done
                continue
            match = _SIGNIFICANT.search(text, self.pos)
            if match is None:
                self.pos = len(text)
                return None
            c, self.pos = match.group(), match.end()
            if c == '"':
                self.in_string = True
            elif c in _CLOSE:
                self.stack.append(_CLOSE[c])
            elif c == self.stack[-1]:
                self.stack.pop()
                if not self.stack:
                    self.done = self.pos
                    return self.done


Members = dict[str, tuple[int, int | None]]
"""key -> (start, end) of each value of an object, end None for a value not finished."""


@dataclass(frozen=True)
class ObjectReading:
    members: Members
    end: int | None
    """The index after the object's closing brace; None while it is open."""


def object_members(text: str, start: int, scan: GrowingScan | None = None) -> Members | None:
    """The members of the object at text[start] ('{') so far; None where the text is not
    such an object (so far). scan: the stream's, to go on from the last call's reading."""
    reading = read_object(text, start, scan)
    return None if reading is None else reading.members


def read_object(text: str, start: int, scan: GrowingScan | None = None
                ) -> ObjectReading | None:
    """object_members, and where the object ends once it has."""
    if text[start:start + 1] != "{":
        return None
    scan = scan or GrowingScan()
    members: Members = {}
    still_open = ObjectReading(members, None)
    i = skip_space(text, start + 1)
    while i < len(text) and text[i] != "}":
        if text[i] == "," and members:
            i = skip_space(text, i + 1)
            if i >= len(text):
                return still_open
        if text[i] != '"':
            return None
        key_end = scan.value_end(text, i)
        if key_end is None:
            return still_open
        colon = skip_space(text, key_end)
        if colon >= len(text):
            return still_open
        if text[colon] != ":":
            return None
        value = skip_space(text, colon + 1)
        if value >= len(text):
            return still_open
        end = scan.value_end(text, value)
        members[string_value(text, i, key_end)] = (value, end)
        if end is None:
            return still_open
        i = skip_space(text, end)
    return ObjectReading(members, i + 1 if i < len(text) else None)


def string_value(text: str, start: int, end: int) -> str:
    """The JSON string at text[start:end] (quotes included) as a str. A stream reads each
    key again at every piece: json's decoder only for one with escapes. Never raises: a bad
    escape gives the text as written (the whole object's json reading refuses it)."""
    inner = text[start + 1:end - 1]
    if "\\" not in inner:
        return inner
    try:
        return json.loads(text[start:end], strict=False)
    except ValueError:
        return inner


def skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _scalar_end(text: str, i: int) -> int | None:
    j = i
    while j < len(text) and text[j] not in ",}] \t\r\n":
        j += 1
    return j if j < len(text) else None
