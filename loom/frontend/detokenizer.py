"""Incremental detokenization and stop strings for one request's output.

Each update decodes only a short window of recent tokens (the prefix/read offset technique):
`prefix_offset..read_offset` is text already emitted, and the new text is whatever decoding
`prefix_offset..` adds beyond it. Decoding from a few tokens back, rather than the new
token alone, keeps the spaces that SentencePiece and byte-level BPE attach to a token
relative to its neighbours; holding text back while it ends in U+FFFD waits for the rest
of a multi-byte character split over tokens. Cost per update is O(new tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# Tokens of prompt context decoded before the first output token, enough for any
# tokenizer's leading-space handling to see a neighbour.
_PROMPT_CONTEXT = 5
_REPLACEMENT_CHAR = "\ufffd"


class _Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text, and finds stop strings in it."""

    def __init__(self, tokenizer: _Decoder, prompt_token_ids: Sequence[int],
                 skip_special_tokens: bool = True, stop: Sequence[str] = (),
                 include_stop_str_in_output: bool = False, min_tokens: int = 0) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stop = [s for s in stop if s]
        self._max_stop_len = max((len(s) for s in self._stop), default=0)
        self._include_stop = include_stop_str_in_output
        # As vLLM: stop strings count only once more than min_tokens tokens are out.
        self._min_tokens = min_tokens
        # Only the prompt's tail is kept: it is all that the first windows look at.
        context = list(prompt_token_ids[-_PROMPT_CONTEXT:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._num_context = len(context)
        self.output_text = ""
        self.stop_reason: str | None = None
        """The stop string that ended the output, once one has."""
        self._sent = 0

    @property
    def output_token_ids(self) -> list[int]:
        return self._ids[self._num_context:]

    @property
    def stopped(self) -> bool:
        return self.stop_reason is not None

    def update(self, new_token_ids: Sequence[int]) -> str | None:
        """Add tokens; return the stop string they completed, if any.

        After a stop string has matched, the output is final and further tokens are ignored.
        """
        if self.stopped or len(new_token_ids) == 0:
            return None
        self._ids.extend(new_token_ids)
        return self._append(self._decode_new_text())

    def flush(self) -> str | None:
        """The request ended: emit text held back for an unfinished multi-byte character
        (as U+FFFD, as a full decode shows it). Returns a stop string it completed, if any."""
        if self.stopped or self._read_offset == len(self._ids):
            return None
        return self._append(self._decode_new_text(final=True))

    def get_next_delta_text(self, finished: bool = False) -> str:
        """Text not returned before. Unless `finished` (or stopped), a tail that could
        still grow into a stop string is held back, so no stream ever shows part of one."""
        end = len(self.output_text)
        if not (finished or self.stopped):
            end = max(self._sent, end - self._partial_stop_len())
        delta = self.output_text[self._sent:end]
        self._sent = end
        return delta

    # -- decoding ---------------------------------------------------------------------------
    def _decode(self, start: int, end: int | None = None) -> str:
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip_special)

    def _decode_new_text(self, final: bool = False) -> str:
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset)
        # Shorter or equal: the new tokens decode to nothing yet (a skipped special token,
        # or bytes of a character still being completed); wait for more.
        if len(full_text) <= len(prefix_text):
            return ""
        if full_text.endswith(_REPLACEMENT_CHAR) and not final:
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text):]

    # -- stop strings -------------------------------------------------------------------------
    def _append(self, text: str) -> str | None:
        if not text:
            return None
        start = len(self.output_text)
        self.output_text += text
        return self._check_stop(start)

    def _check_stop(self, new_text_start: int) -> str | None:
        """Find the stop string that ends first inside the newly added text.

        Ending first, not starting first, is what a token-by-token stream would have hit,
        so the result does not depend on how many tokens arrive per update."""
        if not self._stop or len(self._ids) - self._num_context <= self._min_tokens:
            return None
        window_start = max(0, new_text_start - self._max_stop_len + 1)
        best: tuple[int, int, str] | None = None
        for stop in self._stop:
            index = self.output_text.find(stop, window_start)
            if index != -1:
                candidate = (index + len(stop), index, stop)
                best = candidate if best is None else min(best, candidate)
        if best is None:
            return None
        _, index, stop = best
        self.output_text = self.output_text[:index + len(stop) if self._include_stop else index]
        self.stop_reason = stop
        return stop

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of the output that is a proper prefix of a stop string."""
        text = self.output_text
        longest = 0
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
