"""Where a bracketed Python expression ends in text that may still be growing: enough of
Python's tokenizer (strings in all four quotings, comments, brackets) to stream `pythonic`
tool calls call by call, `[get_weather(city="Paris"), now()]`.

A `Brackets` is kept in the stream's `GrowingScan` and goes on from where the last piece
left it, so a call of n characters costs O(n) however many pieces it arrives in. It only
finds the end: whether the text up to there is a well-formed call is `ast`'s to say.
"""

from __future__ import annotations

import re

_CLOSE = {"(": ")", "[": "]", "{": "}"}
_SIGNIFICANT = re.compile(r"""["'#()\[\]{}]""")


def _string_rest(quote: str) -> re.Pattern[str]:
    """A string's text after its opening quote: to its closing quote (group 1), or to the
    end of the text (group 2: what may yet begin the closing quote or an escape, left to be
    read again with the next piece)."""
    q = re.escape(quote[0])
    if len(quote) == 1:
        return re.compile(rf"(?:[^{q}\\]+|\\.)*(?:({q})|(\\?)\Z)", re.S)
    # Inside a triple-quoted string a quote is text unless two more follow (the end), or
    # the text ends before it can tell.
    return re.compile(rf"(?:[^{q}\\]+|\\.|{q}(?!{q}{q}|{q}?\Z))*(?:({q}{q}{q})|(\\|{q}{q}?)?\Z)",
                      re.S)


_STRING_REST = {quote: _string_rest(quote) for quote in ("'", '"', "'''", '"""')}


class Brackets:
    """The end of the bracketed expression that opens at text[start] (a '(', '[' or '{'):
    the index after its closing bracket. A mismatched closer still closes (the text is not
    Python then, which the caller's parse finds)."""

    def __init__(self, start: int) -> None:
        self.pos = start
        self.stack: list[str] = []
        self.inside = ""
        """The open string's quote, "#" in a comment, "" in code."""
        self.done: int | None = None

    def end(self, text: str) -> int | None:
        while self.done is None and self._step(text):
            pass
        return self.done

    def _step(self, text: str) -> bool:
        """Read on to the next token that matters; False where the text ends first."""
        if self.inside == "#":
            newline = text.find("\n", self.pos)
            self.pos, self.inside = (len(text), "#") if newline < 0 else (newline + 1, "")
            return newline >= 0
        if self.inside:
            match = _STRING_REST[self.inside].match(text, self.pos)
            if not match.group(1):
                self.pos = match.end() - len(match.group(2) or "")
                return False
            self.pos, self.inside = match.end(), ""
            return True
        match = _SIGNIFICANT.search(text, self.pos)
        if match is None:
            self.pos = len(text)
            return False
        c, at = match.group(), match.start()
        if c in "'\"":
            quote = _quote_at(text, at)
            if quote is None:  # maybe a triple quote, not written yet
                self.pos = at
                return False
            self.inside, self.pos = quote, at + len(quote)
        elif c == "#":
            self.inside, self.pos = "#", at + 1
        elif c in _CLOSE:
            self.stack.append(_CLOSE[c])
            self.pos = at + 1
        else:
            self.pos = at + 1
            if self.stack:
                self.stack.pop()
            if not self.stack:
                self.done = self.pos
        return True


def _quote_at(text: str, i: int) -> str | None:
    """The quote a string opens with at text[i]: one character or three; None while the
    text ends in what may still become three."""
    q = text[i]
    if text.startswith(q * 3, i):
        return q * 3
    rest = len(text) - i
    return None if rest < 3 and text.endswith(q * rest) else q
