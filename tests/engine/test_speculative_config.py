"""--speculative-config as vLLM takes it: defaults, spellings, and errors naming the field."""

from __future__ import annotations

import pytest

from loom.engine.arg_utils import EngineArgs
from loom.speculative_config import SpeculativeConfig


def test_defaults_and_spellings():
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (c.method, c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max) == \
        ("ngram", 3, 5, 5)
    c = SpeculativeConfig.parse({"model": "[ngram]", "num_speculative_tokens": 2,
                                 "prompt_lookup_max": 4})
    assert (c.method, c.prompt_lookup_min, c.prompt_lookup_max) == ("ngram", 4, 4)
    c = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 2,
                                 "prompt_lookup_min": 2})
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (2, 2)
    assert SpeculativeConfig.parse(None) is None
    assert SpeculativeConfig.parse(c) is c


@pytest.mark.parametrize("value,message", [
    ('{"method": "eagle", "num_speculative_tokens": 2}',
     "speculative_config.method: 'eagle' is not implemented by loom; supported: ngram, "
     "draft_model"),
    ({"method": "bogus", "num_speculative_tokens": 2}, "speculative_config.method: 'bogus'"),
    ({"num_speculative_tokens": 2}, "speculative_config.method: required"),
    ({"method": "ngram"}, "speculative_config.num_speculative_tokens: required"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "num_speculative_tokens: required, a "
                                                       "positive integer, got 0"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
      "prompt_lookup_max": 2}, "prompt_lookup_min (4) must not exceed prompt_lookup_max (2)"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": "3"},
     "speculative_config.prompt_lookup_max: must be a positive integer, got '3'"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_model_path": "x"},
     "speculative_config: unknown field(s) ['draft_model_path']"),
    ("{not json", "speculative_config: not valid JSON"),
    ("[1]", "speculative_config: expected a JSON object, got list"),
])
def test_errors_name_the_field(value, message):
    with pytest.raises(ValueError) as e:
        EngineArgs(model="llama-3.1-8b", speculative_config=value).create_engine_config()
    assert message in str(e.value)


def test_the_flag_reaches_the_engine_config():
    import argparse
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model", "llama-3.1-8b", "--speculative-config",
                            '{"method": "ngram", "num_speculative_tokens": 4}'])
    config = EngineArgs.from_cli_args(ns).create_engine_config()
    assert config.speculative == SpeculativeConfig(num_speculative_tokens=4, method="ngram")
    assert EngineArgs(model="llama-3.1-8b").create_engine_config().speculative is None
