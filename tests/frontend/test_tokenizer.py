"""loom's torch-free tokenizer against transformers.AutoTokenizer on the same real files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest

import loom.frontend.tokenizer as tokenizer_module
from loom.frontend.tokenizer import Tokenizer, load_tokenizer

TEXTS = [
    "Hello world",
    " leading space and  double  spaces ",
    "line one\nline two\n\n\ttabbed\r\nwindows",
    "naïve café, Straße, ångström",
    "日本語のテキストと中文",
    "emoji 🎉👩‍👩‍👧 and flags 🇫🇷",
    "code: def f(x):\n    return x**2  # squared",
    "numbers 1234567890 3.14159 -42",
    "",
]

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi! What's 2+2?"},
    {"role": "assistant", "content": "4."},
    {"role": "user", "content": "And in French? Réponds en français 🇫🇷"},
]


@pytest.mark.parametrize("add_special_tokens", [True, False])
def test_encode_matches_transformers(tokenizer_pair: tuple[Tokenizer, Any],
                                     add_special_tokens: bool) -> None:
    ours, hf = tokenizer_pair
    # The last text is past the length at which encoding goes through encode_batch.
    long_text = " ".join(TEXTS) * (1 + tokenizer_module._LONG_TEXT_CHARS // len(" ".join(TEXTS)))
    for text in [*TEXTS, long_text]:
        expected = hf.encode(text, add_special_tokens=add_special_tokens)
        assert ours.encode(text, add_special_tokens=add_special_tokens) == expected, text[:80]


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_decode_matches_transformers(tokenizer_pair: tuple[Tokenizer, Any],
                                     skip_special_tokens: bool) -> None:
    ours, hf = tokenizer_pair
    specials = sorted(hf.all_special_ids)
    for text in TEXTS:
        ids = specials[:1] + hf.encode(text, add_special_tokens=False) + specials[-1:]
        expected = hf.decode(ids, skip_special_tokens=skip_special_tokens)
        assert ours.decode(ids, skip_special_tokens=skip_special_tokens) == expected, text


def test_special_ids_and_sizes_match_transformers(tokenizer_pair: tuple[Tokenizer, Any]) -> None:
    ours, hf = tokenizer_pair
    assert ours.bos_token_id == hf.bos_token_id
    assert ours.eos_token_id == hf.eos_token_id
    assert ours.pad_token_id == hf.pad_token_id
    assert ours.eos_token_ids == {hf.eos_token_id}
    assert sorted(ours.all_special_ids) == sorted(hf.all_special_ids)
    assert len(ours) == ours.vocab_size == len(hf)
    ids = hf.encode("tokens: ünïcödé 🎉", add_special_tokens=True)
    assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(smol_tokenizer: Tokenizer, hf_smol: Any,
                                            add_generation_prompt: bool) -> None:
    for messages in (CONVERSATION, CONVERSATION[1:]):  # with and without a system turn
        expected = hf_smol.apply_chat_template(messages, tokenize=False,
                                               add_generation_prompt=add_generation_prompt)
        rendered = smol_tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt)
        assert rendered == expected


def test_missing_chat_template_is_an_error(llama3_tokenizer: Tokenizer) -> None:
    assert llama3_tokenizer.chat_template is None
    with pytest.raises(ValueError, match=r"no chat template; pass one \(--chat-template, or "
                                         r"chat_template=\.\.\. in Python\)"):
        llama3_tokenizer.apply_chat_template(CONVERSATION)


# Exercises what HF templates rely on: trim/lstrip blocks, loop controls, tojson that keeps
# non-ASCII and HTML characters, bos/eos variables and the {% generation %} tag.
FEATURE_TEMPLATE = """{{ bos_token }}
{% for m in messages %}
    {% if m['role'] == 'system' %}{% continue %}{% endif %}
    {% generation %}[{{ m['role'] }}] {{ m['content'] | tojson }}{% endgeneration %}
{{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}[assistant]{% endif %}"""


def test_explicit_template_string_and_file(llama3_dir: str, hf_llama3: Any,
                                           tmp_path: Path) -> None:
    template_file = tmp_path / "template.jinja"
    template_file.write_text(FEATURE_TEMPLATE)
    messages = CONVERSATION + [{"role": "user", "content": "<b>&</b> 日本"}]
    expected = hf_llama3.apply_chat_template(messages, chat_template=FEATURE_TEMPLATE,
                                             tokenize=False, add_generation_prompt=True)
    for source in (FEATURE_TEMPLATE, str(template_file)):
        ours = load_tokenizer(llama3_dir, chat_template=source)
        assert ours.apply_chat_template(messages) == expected
    plain = load_tokenizer(llama3_dir)
    assert plain.apply_chat_template(messages, chat_template=FEATURE_TEMPLATE) == expected
    # A broken one is refused when the tokenizer loads, not at the first chat request.
    with pytest.raises(ValueError, match="chat_template: not a valid Jinja template"):
        load_tokenizer(llama3_dir, chat_template="{% for %}")


def test_template_helpers(llama3_tokenizer: Tokenizer) -> None:
    raising = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(Exception, match="roles must alternate"):
        llama3_tokenizer.apply_chat_template(CONVERSATION, chat_template=raising)
    # What else a template's code can raise is the caller's error too, named as such.
    for broken in ("{{ 1 / 0 }}", "{% for i in range(10**9) %}{% endfor %}",
                   "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"):
        with pytest.raises(ValueError, match="^messages: the chat template refused them: "):
            llama3_tokenizer.apply_chat_template(CONVERSATION, chat_template=broken)
    dated = llama3_tokenizer.apply_chat_template([], chat_template="{{ strftime_now('%Y') }}")
    assert dated.isdigit() and len(dated) == 4
    # Templates ship with downloaded models: no escaping the sandbox, no mutating inputs.
    for hostile in ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "{{ messages.append(1) }}"):
        with pytest.raises(jinja2.exceptions.SecurityError):
            llama3_tokenizer.apply_chat_template(CONVERSATION, chat_template=hostile)


def _copy_tokenizer_dir(source: str, target: Path, config: dict[str, Any]) -> Path:
    target.mkdir()
    shutil.copy(Path(source) / "tokenizer.json", target / "tokenizer.json")
    base = json.loads((Path(source) / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**base, **config}))
    return target


@pytest.mark.parametrize("flags", [{"add_bos_token": False},
                                   {"add_bos_token": True, "add_eos_token": True}])
def test_explicit_bos_eos_flags_match_transformers(llama3_dir: str, tmp_path: Path,
                                                   flags: dict[str, bool]) -> None:
    from transformers import AutoTokenizer
    directory = _copy_tokenizer_dir(llama3_dir, tmp_path / "tok", flags)
    hf = AutoTokenizer.from_pretrained(str(directory))
    ours = load_tokenizer(str(directory))
    for text in TEXTS[:3]:
        assert ours.encode(text) == hf.encode(text)
        bare = hf.encode(text, add_special_tokens=False)
        assert ours.encode(text, add_special_tokens=False) == bare


def test_generation_config_eos_ids_join_eos_token_ids(llama3_dir: str, tmp_path: Path) -> None:
    directory = _copy_tokenizer_dir(llama3_dir, tmp_path / "tok", {})
    generation = {"eos_token_id": [128001, 128009]}
    (directory / "generation_config.json").write_text(json.dumps(generation))
    assert load_tokenizer(str(directory)).eos_token_ids == {128001, 128009}


def test_gguf_tokenizer_is_cached(smol_gguf: str, smol_tokenizer: Tokenizer,
                                  loom_cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_conversion(*args: Any) -> None:
        raise AssertionError("converted again instead of using the cache")

    monkeypatch.setattr(tokenizer_module, "_convert_in_subprocess", no_conversion)
    again = load_tokenizer(smol_gguf)
    assert again.encode("cached") == smol_tokenizer.encode("cached")
    entries = list((loom_cache_dir / "tokenizers").iterdir())
    assert len(entries) == 1 and not entries[0].name.startswith(".")


def test_missing_tokenizer_files_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=str(tmp_path)):
        load_tokenizer(str(tmp_path))


def test_tokenizer_never_imports_torch(llama3_dir: str) -> None:
    code = ("import sys\n"
            "from loom.frontend.tokenizer import load_tokenizer\n"
            f"tok = load_tokenizer({llama3_dir!r})\n"
            "tok.apply_chat_template([{'role': 'user', 'content': 'hi'}],\n"
            "                        chat_template='{{ messages }}')\n"
            "assert tok.encode('hi')\n"
            "leaked = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
            "assert not leaked, leaked\n")
    root = Path(tokenizer_module.__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


_CONVERSION_TRACEBACK = ("Traceback (most recent call last):\n  File \"reader.py\", line 125\n"
                         "    raise ValueError(...)\nValueError: what transformers said")


def _failed_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = subprocess.CompletedProcess([], 1, "", _CONVERSION_TRACEBACK)
    monkeypatch.setattr(tokenizer_module.subprocess, "run", lambda *a, **k: failed)


def test_corrupt_gguf_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOM_CACHE_DIR", str(tmp_path / "cache"))
    _failed_conversion(monkeypatch)
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(ValueError) as e:
        load_tokenizer(str(corrupt))
    assert str(e.value) == f"{corrupt}: not a readable GGUF file (ValueError: GGUF magic invalid)"


def test_truncated_gguf_is_a_one_line_error(smol_gguf: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOM_CACHE_DIR", str(tmp_path / "cache"))
    _failed_conversion(monkeypatch)
    truncated = tmp_path / "truncated.gguf"
    with open(smol_gguf, "rb") as f:
        truncated.write_bytes(f.read(3 * 2**20))
    with pytest.raises(ValueError, match="not a readable GGUF file") as e:
        load_tokenizer(str(truncated))
    assert "\n" not in str(e.value)


def test_failed_conversion_of_a_readable_gguf_keeps_the_last_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOM_CACHE_DIR", str(tmp_path / "cache"))
    _failed_conversion(monkeypatch)
    monkeypatch.setattr(tokenizer_module, "_check_gguf", lambda path: None)  # "readable"
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    with pytest.raises(ValueError) as e:
        load_tokenizer(str(model))
    assert str(e.value) == (f"tokenizer: cannot convert the tokenizer of {model}: "
                            "ValueError: what transformers said")
