"""`loom serve --enable-lora --lora-modules`: a request's `model` names an adapter (or the
base model), answered as `LLM.generate(..., lora_request=...)` answers offline; /v1/models
lists the adapters under their base model; vLLM's errors for an unknown model, an adapter
sent to /v1/embeddings, /score or /rerank, and bad --lora-modules; vLLM's runtime
load/unload endpoints."""

from __future__ import annotations

import asyncio
import json
import re
import shutil

import httpx
import openai
import pytest

from loom import SamplingParams
from loom.lora.request import LoRARequest
from tests.entrypoints.conftest import API_KEY, start_server
from tests.lora_util import cut_short, make_adapter

AUTH = {"Authorization": f"Bearer {API_KEY}"}
BASE = "tiny"
PROMPTS = ["Hello, my name is", "The capital of France is"]
MAX_TOKENS = 10
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
LORA_FLAGS = ("--enable-lora", "--max-model-len", "512", "--served-model-name", BASE,
              "--chat-template", TEMPLATE)
# One server per frontend mode; the in-process one has one adapter slot, so that its mixed
# batches take turns, and the others two. The "mp" one also loads adapters at run time.
MAX_LORAS = {"inproc": "1", "mp": "2", "mp2": "2"}
RUNTIME_ENV = "LOOM_ALLOW_RUNTIME_LORA_UPDATING"


@pytest.fixture(scope="module")
def adapters(tiny_llama_with_tokenizer, tmp_path_factory) -> dict[str, str]:
    """Two adapters of the tiny Llama 3 model: every projection at rank 8, and q/v at 4."""
    base, _ = tiny_llama_with_tokenizer
    root = tmp_path_factory.mktemp("adapters")
    make_adapter(base, str(root / "sql"), seed=1)
    make_adapter(base, str(root / "chat"), targets=("q_proj", "v_proj"), r=4, seed=2)
    return {"sql": str(root / "sql"), "chat": str(root / "chat")}


@pytest.fixture(scope="module")
def expected(tiny_llama_with_tokenizer, adapters) -> dict[str, list[str]]:
    """Greedy texts of PROMPTS offline, by model name (the base's is BASE)."""
    from loom import LLM
    base, _ = tiny_llama_with_tokenizer
    llm = LLM(base, dtype="float32", device="cpu", max_model_len=512, enable_lora=True,
              max_loras=2, kv_cache_memory_bytes=64 * 1024 * 1024)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    requests = {BASE: None, "sql": LoRARequest("sql", 1, adapters["sql"]),
                "chat": LoRARequest("chat", 2, adapters["chat"])}
    try:
        return {name: [o.outputs[0].text for o in llm.generate(
            PROMPTS, params, use_tqdm=False, lora_request=lora)]
            for name, lora in requests.items()}
    finally:
        llm.shutdown()


@pytest.fixture(scope="module", params=list(MAX_LORAS))
def lora_server(request, tiny_llama_with_tokenizer, adapters, tmp_path_factory):
    base, _ = tiny_llama_with_tokenizer
    chat = json.dumps({"name": "chat", "path": adapters["chat"], "base_model_name": BASE})
    env = {RUNTIME_ENV: "true"} if request.param == "mp" else None
    s = start_server(base, request.param, tmp_path_factory.mktemp("lora-logs"), env, extra_args=(
        *LORA_FLAGS, "--max-loras", MAX_LORAS[request.param],
        "--lora-modules", f"sql={adapters['sql']}", chat))
    yield s
    assert s.stop() == 0, s.log_tail()


def _complete(client, model: str, **kw):
    return client.completions.create(model=model, prompt=PROMPTS, max_tokens=MAX_TOKENS,
                                     temperature=0, extra_body={"ignore_eos": True}, **kw)


def test_each_model_answers_as_offline(lora_server, expected):
    """The base and both adapters at once, each as offline; n=2 choices and a stream alike."""
    assert len({tuple(texts) for texts in expected.values()}) == 3, expected  # all differ
    client = lora_server.async_client()

    async def all_at_once():
        return await asyncio.gather(*(_complete(client, name) for name in expected))

    for name, response in zip(expected, asyncio.run(all_at_once())):
        assert [c.text for c in response.choices] == expected[name], name
        assert response.model == name
    client = lora_server.client()
    twice = _complete(client, "sql", n=2)
    assert [c.text for c in twice.choices] == [t for t in expected["sql"] for _ in range(2)]
    stream = client.completions.create(model="chat", prompt=PROMPTS[0], max_tokens=MAX_TOKENS,
                                       temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == expected["chat"][0]
    assert {c.model for c in chunks} == {"chat"}
    # vLLM's lora_requests_info: a sample per (max_lora, waiting, running) seen, the value
    # when last seen; the batches above ran each adapter.
    info = [dict(re.findall(r'(\w+)="([^"]*)"', line)) for line in httpx.get(
        f"{lora_server.url}/metrics", timeout=30).text.splitlines()
        if line.startswith("loom:lora_requests_info{")]
    assert {i["max_lora"] for i in info} == {MAX_LORAS[lora_server.mode]}, info
    running = {name for i in info for name in i["running_lora_adapters"].split(",") if name}
    assert running == {"sql", "chat"}, info


def test_models_lists_the_adapters(lora_server, adapters):
    models = lora_server.client().models.list().data
    assert [m.id for m in models] == [BASE, "sql", "chat"]
    base, sql, chat = (m.model_dump() for m in models)
    assert base["parent"] is None and base["max_model_len"] == 512
    assert (sql["root"], sql["parent"]) == (adapters["sql"], BASE)
    assert (chat["root"], chat["parent"]) == (adapters["chat"], BASE)
    if lora_server.mode == "mp":
        assert not lora_server.introspect()["torch_loaded"]  # adapters read without torch


def test_chat_with_an_adapter(lora_server):
    """Chat runs the adapter too: as a completion of the same rendered prompt."""
    messages = [{"role": "user", "content": "Write a query"}]
    with httpx.Client(base_url=lora_server.url, headers=AUTH, timeout=60) as http:
        ids = http.post("/tokenize", json={"model": "sql", "messages": messages}).json()["tokens"]
        assert http.post("/tokenize", json={"model": BASE, "messages": messages}).json()[
            "tokens"] == ids  # adapters share the base model's tokenizer
    client = lora_server.client()
    texts = {}
    for model in (BASE, "sql"):
        chat = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                              max_tokens=MAX_TOKENS,
                                              extra_body={"ignore_eos": True})
        assert chat.model == model
        texts[model] = chat.choices[0].message.content
        plain = client.completions.create(model=model, prompt=ids, max_tokens=MAX_TOKENS,
                                          temperature=0, extra_body={"ignore_eos": True})
        assert plain.choices[0].text == texts[model]
    assert texts[BASE] != texts["sql"]


def test_beam_search_with_an_adapter(lora_server, expected):
    """One beam keeps each step's best token: the adapter's greedy text."""
    if lora_server.mode != "mp":
        pytest.skip("one mode is enough")
    with httpx.Client(base_url=lora_server.url, headers=AUTH, timeout=60) as http:
        body = {"model": "sql", "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS,
                "use_beam_search": True, "n": 1, "ignore_eos": True}
        response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == expected["sql"][0]


def test_unknown_model_and_embeddings(lora_server):
    with httpx.Client(base_url=lora_server.url, headers=AUTH, timeout=60) as http:
        for path, body in (("/v1/completions", {"prompt": "x"}),
                           ("/v1/chat/completions", {"messages": [{"role": "user",
                                                                   "content": "x"}]})):
            response = http.post(path, json={**body, "model": "nope"})
            assert response.status_code == 404
            assert response.json() == {"error": {
                "message": "The model `nope` does not exist.", "type": "NotFoundError",
                "param": "model", "code": 404}}
        embedded = http.post("/v1/embeddings", json={"model": "sql", "input": "x"})
        assert embedded.status_code == 400
        assert "LoRA adapters are not supported for embeddings" in embedded.json()["error"][
            "message"]
        assert http.post("/v1/embeddings", json={"model": BASE, "input": "x"}).status_code == 200
        for path, body in (("/score", {"text_1": "x", "text_2": ["y", "z"]}),
                           ("/rerank", {"query": "x", "documents": ["y", "z"]})):
            scored = http.post(path, json={**body, "model": "sql"})
            assert scored.status_code == 400 and scored.json()["error"]["param"] == "model"
            assert "LoRA adapters are not supported for scoring" in scored.json()["error"][
                "message"]
            assert http.post(path, json={**body, "model": BASE}).status_code == 200


# -- start-up errors ---------------------------------------------------------------------------

def _serve_error(capsys, base: str, *args: str) -> str:
    from tests.test_cli import _main_error
    return _main_error(capsys, "serve", base, "--max-model-len", "512", "--device", "cpu",
                       "--served-model-name", BASE, *args)


def test_lora_modules_cli_errors(capsys, tiny_llama_with_tokenizer, adapters, tmp_path):
    """Each a one-line error before the engine starts."""
    base, _ = tiny_llama_with_tokenizer
    sql, lora = f"sql={adapters['sql']}", ("--enable-lora",)
    cases = [
        ((), (sql,), "lora_modules: --lora-modules needs --enable-lora"),
        (lora, ("sql",), "lora_modules: 'sql' is neither name=path nor"),
        (lora, ('{"name": "sql"}',), "needs a non-empty string 'path'"),
        (lora, ('{"name": "sql", "path": "/p", "x": 1}',), "must be a JSON object"),
        (lora, ("{not json",), "is not valid JSON"),
        (lora, (sql, f"sql={adapters['chat']}"), "lora_modules: an adapter is already named 'sql'"),
        (lora, (f"{BASE}={adapters['sql']}",),
         f"lora_modules: '{BASE}' is the served model's name"),
        (lora, (f"bad={tmp_path}",), f"lora_modules: 'bad' ({tmp_path}): no adapter_config.json"),
        ((*lora, "--max-lora-rank", "4"), (sql,),
         f"lora_modules: 'sql' ({adapters['sql']}): rank 8 is above max_lora_rank (4)"),
    ]
    for flags, items, message in cases:
        err = _serve_error(capsys, base, *flags, "--lora-modules", *items)
        assert message in err and len(err.strip().splitlines()) == 1, (flags, items, err)


# -- adapters loaded at run time ---------------------------------------------------------------

def test_load_and_unload_at_run_time(lora_server, adapters, expected, tmp_path):
    """Another name for sql's files is a new adapter (a new id), answering as sql does."""
    load = {"lora_name": "sql2", "lora_path": adapters["sql"]}
    prompt = {"model": "sql2", "prompt": PROMPTS, "max_tokens": MAX_TOKENS, "temperature": 0,
              "ignore_eos": True}
    with httpx.Client(base_url=lora_server.url, headers=AUTH, timeout=60) as http:
        if lora_server.mode != "mp":  # not asked for (and refused with several API servers)
            assert http.post("/v1/load_lora_adapter", json=load).status_code == 404
            return
        assert http.post("/v1/completions", json=prompt).status_code == 404
        loaded = http.post("/v1/load_lora_adapter", json=load)
        refused = [http.post("/v1/load_lora_adapter", json=body) for body in (
            load, {"lora_name": BASE, "lora_path": adapters["sql"]},
            {"lora_name": "bad", "lora_path": str(tmp_path)}, {"lora_name": "x"})]
        texts = [c["text"] for c in http.post("/v1/completions", json=prompt).json()["choices"]]
        listed = [m["id"] for m in http.get("/v1/models").json()["data"]]
        unloaded = http.post("/v1/unload_lora_adapter", json={"lora_name": "sql2"})
        gone = http.post("/v1/completions", json=prompt)
        unknown = http.post("/v1/unload_lora_adapter", json={"lora_name": "sql2"})
    assert (loaded.status_code, loaded.text) == (200, "Success: LoRA adapter 'sql2' added "
                                                      "successfully.")
    assert [r.status_code for r in refused] == [400] * 4
    messages = [r.json()["error"]["message"] for r in refused]
    assert "already named 'sql2'" in messages[0] and "served model's name" in messages[1]
    assert "no adapter_config.json" in messages[2] and messages[3].startswith("lora_path")
    assert texts == expected["sql"] and listed == [BASE, "sql", "chat", "sql2"]
    assert unloaded.status_code == 200 and gone.status_code == 404
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "NotFoundError"


def test_an_adapter_that_fails_to_load_fails_only_its_requests(lora_server, adapters,
                                                              expected, tmp_path):
    """An adapter cut short after the server checked it: the workers cannot read it, so its
    request is a 400 naming it (streamed too: it fails before any output), and the engine
    goes on serving."""
    if lora_server.mode != "mp":
        pytest.skip("one mode is enough (and the one that loads adapters at run time)")
    path = shutil.copytree(adapters["chat"], tmp_path / "broken")
    client = lora_server.client()
    with httpx.Client(base_url=lora_server.url, headers=AUTH, timeout=60) as http:
        loaded = http.post("/v1/load_lora_adapter",
                           json={"lora_name": "broken", "lora_path": str(path)})
        assert loaded.status_code == 200, loaded.text
        try:
            cut_short(str(path))
            with pytest.raises(openai.BadRequestError) as whole:
                _complete(client, "broken")
            with pytest.raises(openai.BadRequestError) as streamed:
                _complete(client, "broken", stream=True)
        finally:
            http.post("/v1/unload_lora_adapter", json={"lora_name": "broken"})
    for error in (whole.value, streamed.value):
        assert f"lora_request 'broken' ({path}): the adapter could not be loaded" in \
            error.body["message"], error.body
    assert [c.text for c in _complete(client, BASE).choices] == expected[BASE]


def test_runtime_updating_needs_one_api_server(capsys, tiny_llama_with_tokenizer, monkeypatch):
    base, _ = tiny_llama_with_tokenizer
    monkeypatch.setenv(RUNTIME_ENV, "1")
    err = _serve_error(capsys, base, "--enable-lora", "--api-server-count", "2")
    assert "api_server_count: LOOM_ALLOW_RUNTIME_LORA_UPDATING needs one API server" in err
