"""What a model name means: a local path, a config shipped with the benchmarks, or a
Hugging Face Hub repository already in the local Hugging Face cache.

loom never downloads. `loom serve Qwen/Qwen3-0.6B` runs the snapshot that
`hf download` (or vLLM, or transformers) left in the cache, as vLLM does with
`HF_HUB_OFFLINE=1`: `--revision` picks a branch, tag or full commit id (default main),
`--download-dir` names the cache folder (default: huggingface_hub's, which follows HF_HOME
and HF_HUB_CACHE). huggingface_hub's own lookup reads the cache, so its layout is theirs.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

logger = logging.getLogger(__name__)

SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "bench" / "configs"

NEVER_DOWNLOADED = ("models are never downloaded: fetch a Hub model with `hf download` where "
                    "there is a network and copy its cache folder here")

def shipped_config(name: str) -> Path | None:
    path = SHIPPED_CONFIGS / f"{name.lower()}.json"
    return path if path.is_file() else None


def resolve_name(name: str, revision: str | None, cache_dir: str | None, field: str,
                 required: bool = False) -> str:
    """The snapshot folder of the hub repository name names, from the local cache; name
    itself when it is a local path or a shipped config, or when the cache has no such
    snapshot (the loader then says so, with `missing`; required: a ValueError naming field
    here instead)."""
    if Path(name).exists() or shipped_config(name) is not None:
        if revision is not None:
            logger.info("%s: %s is not a Hugging Face Hub id; revision %r is not used",
                        field, name, revision)
        return name
    if not hub_shaped(name):
        return name
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError
    try:
        return snapshot_download(name, revision=revision, cache_dir=cache_dir,
                                 local_files_only=True)
    except LocalEntryNotFoundError:
        if required:
            raise ValueError(f"{field}: {name!r} is not a local path, and "
                             f"{missing(name, revision, cache_dir)}; {NEVER_DOWNLOADED}") from None
        return name


def missing(name: str, revision: str | None, cache_dir: str | None) -> str:
    """Why a name that is no local path was not found, for the loader's error: what the
    Hugging Face cache lacks, when name could be a hub id."""
    if not hub_shaped(name):
        return "it is not a Hugging Face Hub id either"
    from huggingface_hub import constants
    rev = f"revision {revision!r}" if revision is not None else "its main branch"
    hint = (" (a commit must be named by its full 40-character id)"
            if revision is not None and re.fullmatch(r"[0-9a-f]{7,39}", revision) else "")
    return (f"the Hugging Face cache at {cache_dir or constants.HF_HUB_CACHE} holds no "
            f"snapshot of it at {rev}{hint}")


def hub_shaped(name: str) -> bool:
    """Whether name could be a Hub id (`name` or `owner/name`, by huggingface_hub's own
    rule); anything else is left to the path's error."""
    if Path(name).suffix in (".gguf", ".json"):
        return False
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def check_cache_dir(download_dir: str | None) -> None:
    if download_dir is None:
        return
    if not isinstance(download_dir, str) or not download_dir:
        raise ValueError(f"download_dir: must be a folder's path, got {download_dir!r}")
    if not Path(download_dir).is_dir():
        raise ValueError(f"download_dir: {download_dir} is not a folder; loom never "
                         "downloads, so it only reads models already in it (a Hugging Face "
                         "cache)")


def resolved_names(cfg) -> tuple[str, str | None]:
    """A ModelConfig's model and tokenizer, Hub ids made their cached snapshot folders, once,
    so that every reader (API process, engine, workers) sees a path; one not in the cache
    stays a name, which the loader refuses when it reads the model (a config built as data
    need not exist). ValueError names a bad revision, download_dir or tokenizer."""
    for name in ("revision", "tokenizer_revision"):
        value = getattr(cfg, name)
        if not (value is None or (isinstance(value, str) and bool(value))):
            raise ValueError(f"{name}: must be a branch, tag or commit id, got {value!r}")
    check_cache_dir(cfg.download_dir)
    if not (cfg.tokenizer is None or isinstance(cfg.tokenizer, str)):
        raise ValueError(f"tokenizer: must be a path or a Hugging Face Hub id, got "
                         f"{cfg.tokenizer!r}")
    model = resolve_name(cfg.model, cfg.revision, cfg.download_dir, "model")
    tokenizer = cfg.tokenizer
    if tokenizer:
        revision = cfg.tokenizer_revision or cfg.revision
        tokenizer = resolve_name(tokenizer, revision, cfg.download_dir, "tokenizer",
                                 required=True)
    return model, tokenizer
