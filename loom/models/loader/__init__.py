"""Find a model's config, weights and tokenizer from what the user named.

`--model` may be a Hugging Face directory, a `.gguf` file, a `config.json`, the name of
a config shipped with loom's benchmarks (with `--load-format dummy`), or a Hugging Face Hub
id, which `ModelConfig` has already turned into its snapshot folder (`loom.models.names`).
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from loom.config import ModelConfig
from loom.models.names import NEVER_DOWNLOADED, SHIPPED_CONFIGS, missing, shipped_config
from loom.sampling_params import SamplingParams

if TYPE_CHECKING:
    import torch


WeightIter = Iterator[tuple[str, "torch.Tensor"]]


@dataclass
class ModelSource:
    hf_config: dict
    load_format: str
    """safetensors, gguf or dummy: resolved from auto."""
    weights: Callable[[], WeightIter] | None
    """None for dummy weights."""
    tokenizer_path: str | None


def resolve(cfg: ModelConfig) -> ModelSource:
    """The model's config, weights and tokenizer; every reader of the config (engine core,
    workers, API process, benchmarks) comes here, so all see --hf-overrides alike."""
    source = _resolve(cfg)
    if cfg.hf_overrides:
        source.hf_config = with_overrides(source.hf_config, cfg.hf_overrides)
    if cfg.disable_sliding_window:
        from loom.models.arch import without_sliding_window
        source.hf_config = without_sliding_window(source.hf_config)
    return source


def with_overrides(hf_config: dict, overrides: dict) -> dict:
    """vLLM's --hf-overrides over a config.json dict: each key replaces the file's value
    whole (rope_scaling included), except a nested config (a dict with its own model_type,
    such as text_config), which is updated key by key, its own dicts merged likewise. A new
    dict: the GGUF reader's is cached."""
    merged = dict(hf_config)
    for key, value in overrides.items():
        _check_override(key, value, merged.get(key))
        nested = merged.get(key)
        is_config = isinstance(nested, dict) and "model_type" in nested
        merged[key] = _merged(nested, value) if is_config else value
    return merged


_SIZES = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers",
          "intermediate_size", "vocab_size", "head_dim", "max_position_embeddings")
"""Overrides that size the model: positive integers, or the arithmetic on them fails deep."""


def _check_override(key: str, value: object, current: object) -> None:
    """A ValueError naming the key where an override cannot be what the config holds there:
    a size that is not a positive integer, a string where the file has no string, or no
    object where it has one (rope_scaling). A number may become a list and back
    (eos_token_id takes both)."""
    def kind(v: object) -> str:
        if isinstance(v, bool):
            return "a boolean"
        return ("a number" if isinstance(v, int | float) else "a string" if isinstance(v, str)
                else "a list" if isinstance(v, list) else "an object" if isinstance(v, dict)
                else "null")
    if key in _SIZES and (type(value) is not int or value < 1):
        raise ValueError(f"hf_overrides.{key}: must be a positive integer, got {value!r}")
    if key in ("rope_scaling", "rope_parameters") and value is not None:
        current = current if isinstance(current, dict) else {}  # an object, or null
    if current is None or value is None:
        return
    if (isinstance(value, str) and not isinstance(current, str)) or (
            isinstance(current, dict) != isinstance(value, dict)):
        raise ValueError(f"hf_overrides.{key}: must be {kind(current)} (as config.json's), "
                         f"got {value!r}")


def _merged(base: object, update: object) -> object:
    if not (isinstance(base, dict) and isinstance(update, dict)):
        return update
    return {**base, **{k: _merged(base.get(k), v) for k, v in update.items()}}


def _resolve(cfg: ModelConfig) -> ModelSource:
    path = Path(cfg.model)
    fmt = cfg.load_format
    if fmt == "gguf" or (fmt == "auto" and path.suffix == ".gguf"):
        return _gguf_source(path, cfg)
    if path.suffix == ".gguf" and path.is_file():
        raise ValueError(f"load_format: {fmt!r} does not apply to the GGUF file {cfg.model}; "
                         "use --load-format gguf (or auto)")
    config_path = _config_path(path, cfg)
    hf_config = json.loads(_hf_config_file(cfg, config_path).read_text())
    tokenizer = tokenizer_path(cfg)
    if fmt == "dummy":
        return ModelSource(hf_config, "dummy", None, tokenizer)
    if fmt not in ("auto", "safetensors"):
        raise ValueError(f"load_format: {fmt!r} does not apply to {cfg.model}")
    files = safetensors_files(config_path.parent, cfg.ignore_patterns)
    eager = cfg.safetensors_load_strategy == "eager"
    return ModelSource(hf_config, "safetensors", lambda: iter_safetensors(files, eager),
                       tokenizer)


def _hf_config_file(cfg: ModelConfig, own: Path) -> Path:
    """--hf-config-path's config.json, else the model's own."""
    if cfg.hf_config_path is None:
        return own
    path = Path(cfg.hf_config_path)
    path = path / "config.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"hf_config_path: {cfg.hf_config_path} is neither a config.json nor "
                         "a directory holding one")
    return path


GENERATION_DEFAULTS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                       "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                       "max_new_tokens": "max_tokens"}
"""generation_config.json's keys that set a request's defaults, as vLLM reads them
(`--generation-config auto`): key there -> SamplingParams field."""


def generation_defaults(model: str, generation_config: str = "auto",
                        overrides: dict | None = None) -> dict:
    """The sampling defaults that generation_config.json recommends (Llama 3.1 Instruct:
    temperature 0.6, top_p 0.9), for requests that leave them unset. generation_config is
    vLLM's: "auto" reads the model directory's ({} for a GGUF file, a shipped config, or a
    directory without one), "vllm" none, anything else is a directory to read it from.
    overrides: vLLM's --override-generation-config, the same keys set over the file's (a
    null unsets one). A value SamplingParams would refuse is a ValueError naming the file
    and its key, or the flag."""
    config, source = ({}, "") if generation_config == "vllm" else \
        _read_generation_config(model, generation_config)
    overrides = _known_overrides(overrides or {})
    defaults = {}
    for key, field in GENERATION_DEFAULTS.items():
        value, where = ((overrides[key], "override_generation_config") if key in overrides
                        else (config.get(key), source))
        if value is not None:
            defaults[field] = _checked(value, key, field, where)
    return defaults


def _read_generation_config(model: str, generation_config: str) -> tuple[dict, str]:
    """The generation_config.json that applies ({} when there is none), and how an error in
    it is named."""
    named = generation_config_dir(generation_config)
    file = Path(named) / "generation_config.json" if named else _own_generation_config(model)
    if file is None:
        return {}, ""
    where = "model" if named is None else "generation_config"
    try:
        config = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{where}: cannot read {file} ({e})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{where}: {file} does not hold a JSON object")
    return config, f"{where}: {file}"


def _known_overrides(overrides: dict) -> dict:
    """vLLM reads only these keys of --override-generation-config and drops the rest; a key
    dropped would be a default the user asked for and never got, so it is an error here."""
    unknown = sorted(set(overrides) - set(GENERATION_DEFAULTS))
    if unknown:
        hint = " (generation_config.json calls max_tokens max_new_tokens)" \
            if "max_tokens" in unknown else ""
        raise ValueError(f"override_generation_config: unknown key(s) {unknown}{hint}; it takes "
                         f"{', '.join(GENERATION_DEFAULTS)}")
    return overrides


def _checked(value: object, key: str, field: str, source: str) -> object:
    """value, as SamplingParams takes it for field: checked once here, at start-up, so that
    a bad default is one error naming the file's own key (max_new_tokens, not max_tokens)
    instead of a 400 for every request that leaves the field unset."""
    try:
        SamplingParams(**{field: value})
    except ValueError as e:
        reason = str(e).removeprefix(f"{field}: ")
        raise ValueError(f"{source}: {key}: {reason}") from None
    return value


def _own_generation_config(model: str) -> Path | None:
    path = Path(model)
    directory = path if path.is_dir() else path.parent if path.suffix == ".json" else None
    file = directory / "generation_config.json" if directory is not None else None
    return file if file is not None and file.is_file() else None


def generation_config_dir(generation_config: str) -> str | None:
    """The directory `--generation-config PATH` names, whose generation_config.json stands in
    for the model's (sampling defaults and extra EOS ids, as in vLLM); None for "auto" and
    "vllm", which keep the model's own EOS ids."""
    if generation_config in ("auto", "vllm"):
        return None
    if not (Path(generation_config) / "generation_config.json").is_file():
        raise ValueError(f"generation_config: {generation_config!r} is neither 'auto', 'vllm' "
                         "nor a directory holding a generation_config.json")
    return generation_config


def tokenizer_path(cfg: ModelConfig) -> str | None:
    """Where the tokenizer is, without loading any weights (the API process uses this)."""
    if cfg.tokenizer:
        return cfg.tokenizer
    path = Path(cfg.model)
    if path.suffix == ".gguf":
        return str(path)
    directory = _config_path(path, cfg).parent
    return str(directory) if _has_tokenizer(directory) else None


def _gguf_source(path: Path, cfg: ModelConfig) -> ModelSource:
    from loom.models.loader.gguf import load_gguf
    if path.is_dir():
        raise ValueError(f"load_format: 'gguf' needs a .gguf file, and {path} is a directory; "
                         "name the .gguf file, or use --load-format auto")
    if not path.is_file():
        raise ValueError(f"model: GGUF file {path} does not exist")
    # Parsing a GGUF's metadata takes seconds: open it once, stream the weights later.
    hf_config, weights = load_gguf(str(path))
    return ModelSource(hf_config, "gguf", lambda: weights, cfg.tokenizer or str(path))


def _config_path(path: Path, cfg: ModelConfig) -> Path:
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            ggufs = sorted(p.name for p in path.glob("*.gguf"))
            hint = f"; name one of its GGUF files: {', '.join(ggufs)}" if ggufs else ""
            raise ValueError(f"model: {path} has no config.json{hint}")
        return config
    if path.is_file() and path.suffix == ".json":
        return path
    shipped = shipped_config(str(path))
    if shipped is not None:
        return shipped
    known = sorted(p.stem for p in SHIPPED_CONFIGS.glob("*.json"))
    raise ValueError(f"model: {cfg.model!r} is not a model directory, a .gguf file, a config.json "
                     f"or a shipped config ({', '.join(known)}), and "
                     f"{missing(cfg.model, cfg.revision, cfg.download_dir)}; {NEVER_DOWNLOADED}")


def _has_tokenizer(directory: Path) -> bool:
    return (directory / "tokenizer.json").is_file()


def safetensors_files(directory: Path, ignore: tuple[str, ...] = ()) -> list[Path]:
    """The checkpoint's weight files (its index's, else every *.safetensors), but those whose
    path under `directory` matches an `ignore` pattern (--ignore-patterns, fnmatch's)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        names = [n for n in names if not _ignored(n, ignore)]
        files = [directory / n for n in names]
        absent = [str(f) for f in files if not f.is_file()]
        if absent:
            raise ValueError(f"model: weight files listed in {index.name} are missing: {absent}")
        return files
    files = [f for f in sorted(directory.glob("*.safetensors"))
             if not _ignored(f.name, ignore)]
    if not files:
        raise ValueError(f"model: no *.safetensors weight files in {directory} "
                         f"{'but those --ignore-patterns skips ' if ignore else ''}"
                         "(use --load-format dummy for random weights)")
    return files


def _ignored(name: str, patterns: tuple[str, ...]) -> bool:
    """fnmatch's match, where `**/` may also stand for no folder (`original/**/*` matches
    original/consolidated.safetensors, as in a glob)."""
    return any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(name, p.replace("**/", ""))
               for p in patterns)


def iter_safetensors(files: list[Path], eager: bool = False) -> WeightIter:
    """Each file's tensors: mapped and read one by one, or (eager) from the file read whole
    (--safetensors-load-strategy eager)."""
    from safetensors import safe_open
    from safetensors.torch import load
    for file in files:
        if eager:
            yield from load(file.read_bytes()).items()
            continue
        with safe_open(os.fspath(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)
