"""IncrementalDetokenizer against a full decode of the same ids, on the real tokenizers."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from loom.frontend.detokenizer import IncrementalDetokenizer
from loom.frontend.tokenizer import Tokenizer

PROMPT = "Write a short note:"
TEXTS = [
    "Hello world, this is a plain ASCII sentence with  two spaces.\nAnd a new line.",
    "Multi-byte: café naïve Straße, 日本語のテキスト, 中文字符, "
    "emoji 🎉🚀👩‍👩‍👧 🇫🇷 done",
    "Ünïcödé at the very end: 你好",
]


def _stream(detok: IncrementalDetokenizer, ids: Sequence[int], chunk_sizes: Sequence[int] = (1,),
            ) -> tuple[list[str], str | None]:
    """Feed ids in chunks (cycling through chunk_sizes); returns the deltas and the stop."""
    deltas: list[str] = []
    stop = None
    pos, k = 0, 0
    while pos < len(ids) and stop is None:
        size = chunk_sizes[k % len(chunk_sizes)]
        stop = detok.update(ids[pos:pos + size])
        deltas.append(detok.get_next_delta_text())
        pos, k = pos + size, k + 1
    return deltas, stop


def _detok(tokenizer: Tokenizer, **kwargs: object) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(tokenizer, tokenizer.encode(PROMPT), **kwargs)


@pytest.mark.parametrize("chunks", [(1,), (3, 1, 2)])
def test_text_equals_full_decode(tokenizer: Tokenizer, chunks: tuple[int, ...]) -> None:
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        detok = _detok(tokenizer)
        deltas, stop = _stream(detok, ids, chunks)
        assert stop is None
        assert detok.output_text == tokenizer.decode(ids) == text
        assert "".join(deltas) == text
        assert "\ufffd" not in "".join(deltas)


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_random_ids_equal_full_decode(tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
    # Random ids split characters across tokens, produce invalid bytes and special tokens.
    rng = random.Random(1234)
    specials = tokenizer.all_special_ids
    for _ in range(20):
        ids = [rng.randrange(len(tokenizer)) for _ in range(rng.randrange(1, 40))]
        ids[rng.randrange(len(ids))] = rng.choice(specials)
        detok = _detok(tokenizer, skip_special_tokens=skip_special_tokens)
        deltas, _ = _stream(detok, ids, (1, 2))
        detok.flush()
        deltas.append(detok.get_next_delta_text(finished=True))
        expected = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        assert detok.output_text == expected
        assert "".join(deltas) == expected


def test_split_character_is_never_shown_half_decoded(smol_tokenizer: Tokenizer) -> None:
    text = "日本語のテキスト🎉"
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    # Byte-level BPE needs several tokens per character here: the test means something.
    assert len(ids) > len(text)
    detok = _detok(smol_tokenizer)
    for i in range(len(ids)):
        detok.update(ids[i:i + 1])
        assert "\ufffd" not in detok.output_text
        assert text.startswith(detok.output_text)
    assert detok.output_text == text


def test_update_decodes_a_bounded_window(tokenizer: Tokenizer) -> None:
    class Counting:
        def __init__(self) -> None:
            self.longest = 0

        def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
            self.longest = max(self.longest, len(ids))
            return tokenizer.decode(ids, skip_special_tokens)

    counting = Counting()
    ids = tokenizer.encode(" ".join(TEXTS) * 5, add_special_tokens=False)
    detok = IncrementalDetokenizer(counting, tokenizer.encode(PROMPT))
    _stream(detok, ids)
    assert len(ids) > 200
    assert counting.longest <= 12  # a few tokens of context, never the whole output


def _tokens_of(tokenizer: Tokenizer, text: str, stop: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert stop not in tokenizer.convert_ids_to_tokens(ids)  # the stop spans tokens
    return ids


@pytest.mark.parametrize("include", [False, True])
def test_stop_string_cuts_output(tokenizer: Tokenizer, include: bool) -> None:
    text = "The answer is forty-two. The end of the answer."
    stop = "two. The"
    ids = _tokens_of(tokenizer, text, stop)
    detok = _detok(tokenizer, stop=["never appears", stop], include_stop_str_in_output=include)
    deltas, matched = _stream(detok, ids)
    cut = text.index(stop) + (len(stop) if include else 0)
    assert matched == stop and detok.stop_reason == stop
    assert detok.output_text == text[:cut]
    assert "".join(deltas) + detok.get_next_delta_text() == text[:cut]
    # The match is reported by the update that completed it, not before or after.
    assert len(detok.output_token_ids) < len(ids)
    assert detok.update(ids[-1:]) is None and detok.output_text == text[:cut]


@pytest.mark.parametrize("all_at_once", [False, True])
def test_first_completed_stop_string_wins(tokenizer: Tokenizer, all_at_once: bool) -> None:
    # "beta gamma" starts first but "ta g" is complete first: a stream would stop there,
    # and so must a single update holding every token.
    text = "alpha beta gamma delta"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = _detok(tokenizer, stop=["delta", "beta gamma", "ta g"])
    _, matched = _stream(detok, ids, (len(ids) if all_at_once else 1,))
    assert matched == "ta g"
    assert detok.output_text == "alpha be"


def test_multibyte_stop_string(smol_tokenizer: Tokenizer) -> None:
    text = "Prix: 12€ — 日本語 ok"
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    detok = _detok(smol_tokenizer, stop=["日本"])
    deltas, matched = _stream(detok, ids)
    assert matched == "日本"
    assert detok.output_text == "Prix: 12€ — "


@pytest.mark.parametrize("include", [False, True])
def test_deltas_never_show_part_of_a_stop_string(tokenizer: Tokenizer, include: bool) -> None:
    stop = "STOP_HERE"
    text = "a STOP b STO c STOP_HER d STOP_HERE tail"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = _detok(tokenizer, stop=[stop], include_stop_str_in_output=include)
    final = text[:text.index(stop) + (len(stop) if include else 0)]
    shown = ""
    for i in range(len(ids)):
        detok.update(ids[i:i + 1])
        shown += detok.get_next_delta_text()
        assert final.startswith(shown)
        if detok.stopped:
            break
        # Until the stop matches, no tail that might grow into it is shown.
        assert not any(shown.endswith(stop[:k]) for k in range(1, len(stop)))
    assert shown + detok.get_next_delta_text() == final


def test_held_back_tail_is_released_when_finished(tokenizer: Tokenizer) -> None:
    text = "the last words are STOP_HE"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = _detok(tokenizer, stop=["STOP_HERE"])
    deltas, matched = _stream(detok, ids)
    assert matched is None
    assert "".join(deltas) == "the last words are "
    assert detok.get_next_delta_text(finished=True) == "STOP_HE"
    assert detok.get_next_delta_text(finished=True) == ""
