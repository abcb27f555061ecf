"""The tokenizer and chat template of the API server, without torch or transformers.

Built on the `tokenizers` library (the Rust tokenizer that transformers itself wraps) and
`jinja2`, because `transformers.AutoTokenizer` imports torch and the API server process
must stay torch-free. A `.gguf` file is converted once, by transformers in a subprocess,
into a tokenizer directory that is cached on disk.

Behaviour follows `transformers.AutoTokenizer` (v5) for the same files: the `tokenizer.json`
pipeline is used as is, its post-processor alone deciding BOS/EOS insertion
(transformers drops `add_bos_token` / `add_eos_token` from `tokenizer_config.json` when a
`tokenizer.json` exists). Decoding never applies `clean_up_tokenization_spaces`: it
corrupts BPE text (transformers skips it for BPE too) and would break incremental
detokenization.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _Backend

from loom import envs

# The named special tokens of transformers, in the order it lists them in all_special_ids.
_NAMED_SPECIAL = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                  "cls_token", "mask_token")
_EXTRA_SPECIAL = ("additional_special_tokens", "extra_special_tokens")
_LOOM_ROOT = Path(__file__).resolve().parents[2]


class Tokenizer:
    """Encode, decode and render chat templates; the subset of transformers' API loom uses."""

    def __init__(self, backend: _Backend, special: dict[str, str | None],
                 extra_special: list[str], eos_ids: Iterable[int],
                 chat_template: str | None, name: str) -> None:
        self._backend = backend
        self._special = special
        self._extra_special = extra_special
        self._generation_eos_ids = frozenset(eos_ids)
        self.chat_template = chat_template
        self.name = name
        # Read once: the frontend checks every prompt id against it.
        self._vocab_size = backend.get_vocab_size(with_added_tokens=True)

    # -- ids ----------------------------------------------------------------------------
    def _special_id(self, key: str) -> int | None:
        token = self._special.get(key)
        return None if token is None else self._backend.token_to_id(token)

    @property
    def bos_token(self) -> str | None:
        return self._special.get("bos_token")

    @property
    def eos_token(self) -> str | None:
        return self._special.get("eos_token")

    @property
    def bos_token_id(self) -> int | None:
        return self._special_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self._special_id("eos_token")

    @property
    def sep_token_id(self) -> int | None:
        return self._special_id("sep_token")

    @property
    def pad_token_id(self) -> int | None:
        return self._special_id("pad_token")

    @property
    def eos_token_ids(self) -> set[int]:
        """Every id that ends generation: the tokenizer's EOS and generation_config's."""
        ids = set(self._generation_eos_ids)
        if self.eos_token_id is not None:
            ids.add(self.eos_token_id)
        return ids

    @property
    def all_special_ids(self) -> list[int]:
        """Ids of the named special tokens (bos, eos, unk, pad, ... and extras), as transformers."""
        tokens = [self._special.get(k) for k in _NAMED_SPECIAL] + self._extra_special
        ids = (self._backend.token_to_id(t) for t in tokens if t is not None)
        return list(dict.fromkeys(i for i in ids if i is not None))

    @property
    def vocab_size(self) -> int:
        """All ids the tokenizer can produce, added tokens included."""
        return self._vocab_size

    def __len__(self) -> int:
        return self._vocab_size

    # -- text ---------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > _LONG_TEXT_CHARS:
            # `encode_batch` lets go of the GIL while it works and `encode` does not: a
            # long text then stalls no other thread (the API server's event loop).
            return self._backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_pair(self, text: str, pair: str, add_special_tokens: bool = True) -> list[int]:
        """transformers' `tokenizer(text, text_pair=pair)`: the post-processor's pair template
        (a cross-encoder's query and document as one sequence)."""
        if len(text) + len(pair) > _LONG_TEXT_CHARS:  # as encode: without the GIL
            return self._backend.encode_batch([(text, pair)],
                                              add_special_tokens=add_special_tokens)[0].ids
        return self._backend.encode(text, pair, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def to_json_str(self) -> str:
        """The `tokenizer.json` pipeline, serialized (llguidance builds its tokenizer from it)."""
        return self._backend.to_str()

    @functools.cached_property
    def special_frame(self) -> tuple[list[int], list[int]]:
        """The special tokens encode puts before and after a text ([CLS] and [SEP] for
        BERT, <|begin_of_text|> for Llama 3): ([], []) where it adds none."""
        bare = self.encode("a", add_special_tokens=False)
        full = self.encode("a")
        for start in range(len(full) - len(bare) + 1):
            if full[start:start + len(bare)] == bare:
                return full[:start], full[start + len(bare):]
        return [], []

    def token_to_id(self, token: str) -> int | None:
        """The vocabulary's id of one token, as written in it (None: not in it)."""
        return self._backend.token_to_id(token)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str | None]:
        return [self._backend.id_to_token(i) for i in ids]

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            add_generation_prompt: bool = True,
                            chat_template: str | None = None, **kwargs: Any) -> str:
        """Render `messages` into a prompt string; extra kwargs become template variables."""
        template = chat_template or self.chat_template
        if template is None:
            raise ValueError(f"tokenizer {self.name} has no chat template; pass one "
                             "(--chat-template, or chat_template=... in Python)")
        # tools and documents are always defined, as in transformers: templates test
        # `tools is not none`, which an undefined variable would pass.
        variables: dict[str, Any] = {"tools": None, "documents": None}
        variables.update((k, v) for k, v in self._special.items() if v is not None)
        variables.update(kwargs)
        try:
            return render_chat_template(template, messages=messages,
                                        add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.exceptions.SecurityError:
            raise  # a hostile template is the operator's problem, not a bad request
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError,
                IndexError, ArithmeticError, RecursionError) as e:  # 1/0, range(10**9), a loop
            # The template is code run on the caller's messages: what breaks it (a field of
            # a type it does not expect, raise_exception) is the caller's to fix.
            raise ValueError(f"messages: the chat template refused them: "
                             f"{type(e).__name__}: {e}") from e


# -- chat templates -------------------------------------------------------------------------
class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant spans for training masks;
    for inference it renders its body unchanged, but templates fail to parse without it."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja2's own tojson escapes HTML characters (<, >, &), which chat templates must not do.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _make_environment() -> ImmutableSandboxedEnvironment:
    # Sandboxed because chat templates come with downloaded models and are untrusted code.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _make_environment()


@functools.lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    # Parsing a template costs far more than rendering it, and a server renders one per request.
    return _ENV.from_string(template)


def render_chat_template(template: str, **variables: Any) -> str:
    return _compile(template).render(**variables)


def parse_chat_template(template: str) -> jinja2.nodes.Template:
    """The template's syntax tree, parsed as it is rendered ({% generation %} and all)."""
    return _ENV.parse(template)


# -- loading --------------------------------------------------------------------------------
_LONG_TEXT_CHARS = 16384


def load_tokenizer(path: str, chat_template: str | None = None,
                   generation_config: str | None = None) -> Tokenizer:
    """Load a tokenizer from a Hugging Face directory or a `.gguf` file.

    `chat_template` overrides the tokenizer's own: a template string or a file holding one.
    `generation_config`: a directory whose generation_config.json lists the EOS ids instead
    of the tokenizer's own directory (`--generation-config PATH`).
    """
    source = Path(path)
    if source.is_file() and source.suffix == ".gguf":
        source = gguf_tokenizer_dir(source)
    elif source.is_file():
        source = source.parent
    if not (source / "tokenizer.json").is_file():
        raise ValueError(f"tokenizer: {path} has no tokenizer.json (expected a Hugging Face "
                         "tokenizer directory or a .gguf file)")
    generation = Path(generation_config) if generation_config is not None else source
    return _load_dir(source, path, chat_template, generation / "generation_config.json")


def _load_dir(directory: Path, name: str, chat_template: str | None,
              generation_file: Path) -> Tokenizer:
    config = _read_json(directory / "tokenizer_config.json")
    special = _special_tokens(config, _read_json(directory / "special_tokens_map.json"))
    extra = _extra_special_tokens(config)
    backend = _Backend.from_file(str(directory / "tokenizer.json"))
    if config.get("split_special_tokens"):
        backend.encode_special_tokens = True
    generation = _read_json(generation_file)
    template = _resolve_template(chat_template) or _own_template(directory, config)
    if chat_template is not None:  # the caller's: a syntax error is theirs, said at load
        try:
            _compile(template)
        except jinja2.TemplateSyntaxError as e:
            raise ValueError(f"chat_template: not a valid Jinja template: {e}") from None
    return Tokenizer(backend, special, extra, _as_ids(generation.get("eos_token_id")),
                     template, name)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"tokenizer: cannot read {path}: {e}") from e


def _token_content(value: Any) -> str | None:
    # Saved either as a plain string or as a serialized AddedToken dict.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens(config: dict[str, Any], special_map: dict[str, Any]) -> dict[str, str | None]:
    # special_tokens_map.json wins over tokenizer_config.json, as in transformers.
    merged = {**config, **{k: v for k, v in special_map.items() if v is not None}}
    return {key: _token_content(merged.get(key)) for key in _NAMED_SPECIAL}


def _extra_special_tokens(config: dict[str, Any]) -> list[str]:
    tokens: list[str] = []
    for key in _EXTRA_SPECIAL:
        values = config.get(key) or []
        values = values.values() if isinstance(values, dict) else values
        tokens += [t for t in map(_token_content, values) if t is not None]
    return tokens


def _as_ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _resolve_template(template: str | None) -> str | None:
    """An explicit template is either a file path or the template text itself."""
    if template is None:
        return None
    if "{" not in template and Path(template).is_file():
        return Path(template).read_text(encoding="utf-8")
    if "{" not in template:
        raise ValueError(f"chat template: {template!r} is neither a file nor a jinja template")
    return template


def _own_template(directory: Path, config: dict[str, Any]) -> str | None:
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        # Named templates (default, tool_use, rag, ...): generation uses the default one.
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        return named.get("default")
    return template if isinstance(template, str) else None


# -- GGUF conversion --------------------------------------------------------------------------
def tokenizer_cache_root() -> Path:
    return envs.cache_dir() / "tokenizers"


def gguf_tokenizer_dir(gguf_path: Path) -> Path:
    """A tokenizer directory converted from `gguf_path`, made once and cached.

    The key covers path, size and mtime, so an edited or replaced file is converted anew.
    """
    stat = gguf_path.stat()
    key = f"{gguf_path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    target = tokenizer_cache_root() / hashlib.sha256(key.encode()).hexdigest()
    if (target / "tokenizer.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert_in_subprocess(gguf_path, scratch)
        try:
            os.rename(scratch, target)
        except OSError:
            # Another process finished the same conversion first: keep theirs.
            if not (target / "tokenizer.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _check_gguf(gguf_path: Path) -> None:
    """The model loader's one-line message for a corrupt or truncated file. Only once a
    conversion has failed: parsing a GGUF takes seconds. gguf needs numpy, never torch."""
    from gguf import GGUFReader
    try:
        GGUFReader(gguf_path, "r")
    except Exception as e:  # gguf raises assorted errors (ValueError, struct.error, ...)
        raise ValueError(f"{gguf_path}: not a readable GGUF file ({type(e).__name__}: {e})") from e


def _convert_in_subprocess(gguf_path: Path, out_dir: Path) -> None:
    # transformers (and so torch) is imported only in the child, never in this process.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_LOOM_ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "loom.frontend.gguf_tokenizer", str(gguf_path), str(out_dir)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        _check_gguf(gguf_path)
        lines = result.stderr.strip().splitlines() or ["no error output"]
        # The last line is the exception; the lines above it are its traceback.
        raise ValueError(f"tokenizer: cannot convert the tokenizer of {gguf_path}: {lines[-1]}")
