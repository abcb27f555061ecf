"""Structured output over HTTP: OpenAI's response_format, vLLM's structured_outputs and its
older guided_* fields on both endpoints, and a 400 with an OpenAI error body for constraints
that do not compile."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.entrypoints.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "rainy"],
          "properties": {"city": {"enum": ["Oslo", "Lima"]}, "rainy": {"type": "boolean"}}}
MESSAGES = [{"role": "user", "content": "Weather?"}]

# Guided decoding lives in the engine core: the engine core in its own process is the case
# that matters, and the frontend modes add nothing to it.
pytestmark = pytest.mark.parametrize("server", ["mp"], indirect=True)


def _model(client) -> str:
    return client.models.list().data[0].id


def test_completions_guided_fields(server):
    client = server.client()
    model = _model(client)
    choice = client.completions.create(model=model, prompt="Pick one:", max_tokens=10, n=2,
                                       temperature=1.0, seed=3,
                                       extra_body={"guided_choice": ["red", "green"]})
    assert {c.text for c in choice.choices} <= {"red", "green"}
    assert all(c.finish_reason == "stop" for c in choice.choices)
    stream = client.completions.create(model=model, prompt="Code:", max_tokens=10, stream=True,
                                       temperature=0, extra_body={"guided_regex": r"[A-Z]{2}\d"})
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert re.fullmatch(r"[A-Z]{2}\d", text), text


def test_structured_outputs_field(server):
    """vLLM's structured_outputs (its guided_* fields' replacement since vLLM 0.12)."""
    client = server.client()
    model = _model(client)
    choice = client.completions.create(model=model, prompt="Pick one:", max_tokens=10, n=2,
                                       temperature=1.0, seed=5, extra_body={
                                           "structured_outputs": {"choice": ["red", "green"]}})
    assert {c.text for c in choice.choices} <= {"red", "green"}
    response = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=30, extra_body={
            "structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}})
    value = json.loads(response.choices[0].message.content)
    assert value["city"] in ("Oslo", "Lima") and isinstance(value["rainy"], bool)


def test_chat_response_format_json_schema(server):
    client = server.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA,
                                                  "strict": True}}
    response = client.chat.completions.create(model=_model(client), messages=MESSAGES, n=2,
                                              max_tokens=30, response_format=fmt)
    for choice in response.choices:
        value = json.loads(choice.message.content)
        assert value["city"] in ("Oslo", "Lima") and isinstance(value["rainy"], bool)
        assert choice.finish_reason == "stop"


BAD = [
    ("/v1/completions", {"prompt": "x", "guided_regex": "(ab"}, "regex"),
    ("/v1/completions", {"prompt": "x", "guided_json": {"type": "bogus"}}, "json"),
    ("/v1/completions", {"prompt": "x", "guided_choice": ["a"], "guided_regex": "a"},
     "guided_regex"),
    ("/v1/completions", {"prompt": "x", "guided_grammar": "start: ((", "stream": True},
     "grammar"),
    ("/v1/chat/completions", {"messages": MESSAGES, "response_format": {"type": "json_schema"}},
     "response_format"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"structural_tag": "{}"}},
     "structured_outputs.structural_tag"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {}}, "structured_outputs"),
    ("/v1/completions", {"prompt": "x", "structured_outputs": {"regex": "(ab"}}, "regex"),
    ("/v1/chat/completions", {"messages": MESSAGES, "guided_choice": ["a"],
                              "structured_outputs": {"regex": "a"}}, "guided_choice"),
    # These compile, but match no text: refused before generating from them.
    ("/v1/completions", {"prompt": "x", "guided_grammar": 'start: a\na: a "x"'}, "grammar"),
    ("/v1/completions", {"prompt": "x", "guided_regex": "[^\\x00-\\U0010FFFF]"}, "regex"),
    ("/v1/chat/completions", {"messages": MESSAGES, "stream": True, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}},
     "json"),
]


@pytest.mark.parametrize("path, body, names", BAD)
def test_bad_constraints_are_400(server, path, body, names):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as http:
        r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == 400 and names in error["message"], error


def test_a_grammar_failing_mid_generation_is_an_error_not_a_stop(server):
    """llguidance gives up on this regex after a few tokens (too many states). The output
    then no longer follows the constraint: the client gets an error, not "stop"."""
    body = {"prompt": "x", "max_tokens": 8, "temperature": 0,
            "guided_regex": "(a{1000}){1000}"}
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as http:
        whole = http.post("/v1/completions", json=body)
        assert whole.status_code == 400, whole.text
        assert "guided_decoding" in whole.json()["error"]["message"]
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert r.status_code in (200, 400)
        if r.status_code == 200:  # failed after the first token: in-band, then [DONE]
            assert any('"error"' in line and "guided_decoding" in line for line in lines), lines
        assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
