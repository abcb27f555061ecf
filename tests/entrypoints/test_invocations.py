"""SageMaker's routes, as vLLM serves them: /ping answers as /health; POST /invocations
sends a body to the route its fields name, which answers it as if it had been sent there
(its checks and the API key included)."""

from __future__ import annotations

import httpx
import pytest

from tests.entrypoints.conftest import API_KEY

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 6, "temperature": 0}
COMPLETION = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}
EMBEDDING = {"input": ["a cat", "a dog"]}


@pytest.fixture(scope="module")
def http(parsing_server):
    with httpx.Client(base_url=parsing_server.url, timeout=60,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as client:
        yield client


def _same(a: dict, b: dict) -> None:
    """Two answers to one request: equal but for their ids, times and cached prompt
    tokens (the second finds the first's prefix cached); embeddings to float32 rounding
    (one batch's sums are not another's)."""
    for answer in (a, b):
        del answer["id"]
        answer.pop("created", None)
        answer["usage"].pop("prompt_tokens_details", None)
    if a.get("object") == "list":
        for x, y in zip(a.pop("data"), b.pop("data"), strict=True):
            assert x.pop("embedding") == pytest.approx(y.pop("embedding"), rel=1e-4, abs=1e-5)
            assert x == y
    assert a == b


@pytest.mark.parametrize("path, body", [("/v1/chat/completions", CHAT),
                                        ("/v1/completions", COMPLETION),
                                        ("/v1/embeddings", EMBEDDING)])
def test_invocations_answer_as_the_route_the_body_names(http, path, body):
    direct = http.post(path, json=body)
    via = http.post("/invocations", json=body)
    assert direct.status_code == via.status_code == 200, via.text
    _same(direct.json(), via.json())


def test_invocations_refusals(http, parsing_server):
    bad = http.post("/invocations", json={**CHAT, "max_tokens": -1})  # the route's own check
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
    for body, says in ((b"{oops", "invocations: Expecting"), (b"[1]", "must be a JSON object"),
                       (b'{"text": "x"}', "no route takes this body")):
        r = http.post("/invocations", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    keyless = httpx.post(f"{parsing_server.url}/invocations", json=CHAT, timeout=60)
    assert keyless.status_code == 401  # the key is checked on the route it reaches


def test_ping_is_health(http):
    assert http.get("/ping").status_code == http.post("/ping").status_code == 200
