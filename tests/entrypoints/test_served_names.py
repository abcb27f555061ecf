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
