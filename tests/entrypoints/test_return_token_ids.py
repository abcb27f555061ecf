"""vLLM's `return_token_ids` on /v1/completions and /v1/chat/completions, whole and
streamed: the prompt's ids equal the tokenizer's (completions) or /tokenize's (chat), the
generated ids equal those logprobs name with return_tokens_as_token_ids and decode to the
text (chat: the content and the end-of-turn token); a stream's pieces add up to the whole
response; off or unset, the keys stay null (whole) or out (streamed); a non-boolean is a
400. Also with n > 1, echo, beam search, the parsers, --stream-interval and run-batch."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer as HFTokenizer

from loom.cli import main
from tests.entrypoints.conftest import API_KEY, OUTPUT_FIELD_MODES, forced, start_server

pytestmark = OUTPUT_FIELD_MODES

PROMPT = "The capital of France is"
MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Capital of France?"}]
ANSWER = "Paris, of course."
END = "<|im_end|>"
ON = {"return_token_ids": True}
AS_IDS = {"return_tokens_as_token_ids": True}


@pytest.fixture(scope="module")
def tokenizer(tiny_chat_model) -> HFTokenizer:
    """The reference for ids: the model's own tokenizer.json, read by `tokenizers`."""
    return HFTokenizer.from_file(str(Path(tiny_chat_model) / "tokenizer.json"))


def _model(server) -> str:
    return server.client().models.list().data[0].id


def _ids(tokens: list[str]) -> list[int]:
    """The ids logprobs name with return_tokens_as_token_ids ("token_id:<id>")."""
    assert all(t.startswith("token_id:") for t in tokens), tokens
    return [int(t.removeprefix("token_id:")) for t in tokens]


def _extra(choice) -> dict:
    """What the openai client kept of a choice or chunk beyond its own fields (as sent)."""
    return choice.model_extra or {}


# -- completions ----------------------------------------------------------------------------

def _completion(server, **kw) -> dict:
    return {"model": _model(server), "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "logprobs": 0, **kw}


def test_completion_ids_are_the_prompts_and_the_generated(server, tokenizer):
    client = server.client()
    kw = _completion(server, extra_body={**ON, **AS_IDS, "ignore_eos": True})
    choice = client.completions.create(**kw).choices[0]
    assert choice.prompt_token_ids == tokenizer.encode(PROMPT).ids
    assert choice.token_ids == _ids(choice.logprobs.tokens) and len(choice.token_ids) == 8
    assert tokenizer.decode(choice.token_ids) == choice.text
    chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw)]
    assert _extra(chunks[0])["prompt_token_ids"] == choice.prompt_token_ids
    assert all("prompt_token_ids" not in _extra(c) for c in chunks[1:])
    streamed = [t for c in chunks for t in _extra(c)["token_ids"]]  # on every chunk
    assert streamed == choice.token_ids
    assert streamed == _ids([t for c in chunks for t in c.logprobs.tokens])


def test_completion_ids_with_echo_are_the_generated_only(server, tokenizer):
    kw = _completion(server, echo=True, extra_body={**ON, **AS_IDS, "ignore_eos": True})
    choice = server.client().completions.create(**kw).choices[0]
    prompt = tokenizer.encode(PROMPT).ids
    assert choice.prompt_token_ids == prompt and len(choice.token_ids) == 8
    assert _ids(choice.logprobs.tokens) == prompt + choice.token_ids
    assert choice.text == PROMPT + tokenizer.decode(choice.token_ids)
    chunks = [c.choices[0] for c in server.client().completions.create(stream=True, **kw)]
    assert _extra(chunks[0])["prompt_token_ids"] == prompt
    assert [t for c in chunks for t in _extra(c)["token_ids"]] == choice.token_ids


def test_each_choice_of_each_prompt_carries_its_own(server, tokenizer):
    prompts = [PROMPT, "Once upon a time"]
    kw = _completion(server, prompt=prompts, n=2, temperature=1.0, seed=7, max_tokens=5,
                     extra_body={**ON, **AS_IDS, "ignore_eos": True})
    whole = server.client().completions.create(**kw)
    assert [c.prompt_token_ids for c in whole.choices] == [
        tokenizer.encode(p).ids for p in prompts for _ in range(2)]
    assert all(c.token_ids == _ids(c.logprobs.tokens) for c in whole.choices)
    first: dict[int, list[int]] = {}
    ids: dict[int, list[int]] = {}
    for chunk in server.client().completions.create(stream=True, **kw):
        for c in chunk.choices:
            if c.index not in first:
                first[c.index] = _extra(c)["prompt_token_ids"]
            else:
                assert "prompt_token_ids" not in _extra(c)
            assert _extra(c)["token_ids"] == _ids(c.logprobs.tokens)
            ids.setdefault(c.index, []).extend(_extra(c)["token_ids"])
    assert [first[i] for i in range(4)] == [c.prompt_token_ids for c in whole.choices]
    assert all(len(ids[i]) == 5 for i in range(4))


def test_beam_search_gives_each_beams_ids(server, tokenizer):
    kw = _completion(server, n=2, logprobs=None, max_tokens=4,
                     extra_body={**ON, "use_beam_search": True, "ignore_eos": True})
    whole = server.client().completions.create(**kw)
    assert len({tuple(c.token_ids) for c in whole.choices}) == 2
    for c in whole.choices:
        assert c.prompt_token_ids == tokenizer.encode(PROMPT).ids
        assert len(c.token_ids) == 4 and tokenizer.decode(c.token_ids) == c.text
    assert whole.usage.completion_tokens == 8


# -- chat -----------------------------------------------------------------------------------

def _rendered(server) -> list[int]:
    with server.http(headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        return http.post("/tokenize", json={"messages": MESSAGES}).json()["tokens"]


def _chat(server, text: str | None = ANSWER, extra_body: dict | None = None, **kw) -> dict:
    """A chat request asking for ids; text: what the model is made to write (None: free)."""
    extra = {**ON, **AS_IDS, **(forced(text) if text else {}), **(extra_body or {})}
    return {"model": _model(server), "messages": MESSAGES, "max_tokens": 20, "temperature": 0,
            "logprobs": True, "extra_body": extra, **kw}


def _ends_at(tokenizer, tokens: int) -> dict:
    """extra_body for a greedy reply of `tokens` tokens and the end-of-turn token: EOS is
    masked for min_tokens, then biased to be the greedy choice. (A forced text ends when
    its grammar completes, before any EOS.)"""
    return {"min_tokens": tokens, "logit_bias": {str(tokenizer.token_to_id(END)): 100}}


def test_chat_ids_are_the_rendered_prompt_and_the_reply_with_its_end(server, tokenizer):
    client = server.client()
    kw = _chat(server, None, _ends_at(tokenizer, 4))
    whole = client.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert (choice.finish_reason, choice.stop_reason) == ("stop", None)
    assert _extra(whole)["prompt_token_ids"] == _rendered(server)
    ids = _extra(choice)["token_ids"]
    assert ids == _ids([t.token for t in choice.logprobs.content])
    assert tokenizer.decode(ids, skip_special_tokens=False) == choice.message.content + END
    assert len(ids) == whole.usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert _extra(chunks[0])["prompt_token_ids"] == _extra(whole)["prompt_token_ids"]
    assert all("prompt_token_ids" not in c.model_dump() for c in chunks[1:])
    streamed = [t for c in chunks for t in _extra(c.choices[0]).get("token_ids", [])]
    assert streamed == ids


def test_a_forced_replys_ids_decode_to_its_text(server, tokenizer):
    whole = server.client().chat.completions.create(**_chat(server))
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (ANSWER, "stop")
    assert tokenizer.decode(_extra(whole.choices[0])["token_ids"]) == ANSWER


def test_chat_choices_each_carry_their_ids(server):
    kw = _chat(server, None, {"ignore_eos": True}, n=2, temperature=1.0, seed=5, max_tokens=6)
    whole = server.client().chat.completions.create(**kw)
    for c in whole.choices:
        assert _extra(c)["token_ids"] == _ids([t.token for t in c.logprobs.content])
        assert len(_extra(c)["token_ids"]) == 6
    ids: dict[int, list[int]] = {0: [], 1: []}
    prompts = []
    for chunk in server.client().chat.completions.create(stream=True, **kw):
        if "prompt_token_ids" in _extra(chunk):
            prompts.append(_extra(chunk)["prompt_token_ids"])
        for c in chunk.choices:
            ids[c.index] += _extra(c).get("token_ids", [])
            if c.logprobs:
                assert _extra(c)["token_ids"] == _ids([t.token for t in c.logprobs.content])
    assert prompts == [_extra(whole)["prompt_token_ids"]] * 2  # each choice's role chunk
    assert [len(ids[0]), len(ids[1])] == [6, 6]


def test_chat_beam_search_gives_each_beams_ids(server, tokenizer):
    kw = _chat(server, None, {"use_beam_search": True, "ignore_eos": True}, n=2, max_tokens=4)
    del kw["logprobs"]  # beam search takes none; loom's chat refuses a null logprobs
    whole = server.client().chat.completions.create(**kw)
    assert _extra(whole)["prompt_token_ids"] == _rendered(server)
    for c in whole.choices:
        assert tokenizer.decode(_extra(c)["token_ids"]) == c.message.content


THOUGHT_AND_CALL = ('<think>\nIt is in France.\n</think>\n\nChecking.\n<tool_call>\n'
                    '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "required": ["city"],
                                          "properties": {"city": {"type": "string"}}}}}]


def test_ids_are_the_raw_output_whatever_the_parsers_read(parsing_server, tokenizer):
    client = parsing_server.client()
    kw = _chat(parsing_server, THOUGHT_AND_CALL, tools=TOOLS, max_tokens=80)
    whole = client.chat.completions.create(**kw)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    ids = _extra(choice)["token_ids"]
    # The forced text ends with its grammar, no EOS after it (see _ends_at).
    assert tokenizer.decode(ids, skip_special_tokens=False) == THOUGHT_AND_CALL
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert [t for c in chunks if c.choices
            for t in _extra(c.choices[0]).get("token_ids", [])] == ids


# -- off, unset, bad ------------------------------------------------------------------------

def _post(server, path: str, body: dict) -> httpx.Response:
    with server.http(headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as http:
        return http.post(path, json=body)


def _sse(response: httpx.Response) -> list[dict]:
    lines = [line.removeprefix("data: ") for line in response.text.splitlines()
             if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("value", [False, None, "unset"])
def test_off_or_unset_leaves_the_keys_null_or_out(server, value):
    fields = {} if value == "unset" else {"return_token_ids": value}
    model = _model(server)
    bodies = {"/v1/completions": {"prompt": PROMPT},
              "/v1/chat/completions": {"messages": MESSAGES}}
    for path, body in bodies.items():
        body = {"model": model, "max_tokens": 3, **body, **fields}
        whole = _post(server, path, body).json()
        assert whole.get("prompt_token_ids") is None
        assert all(c.get("token_ids") is None and c.get("prompt_token_ids") is None
                   for c in whole["choices"])
        chunks = _sse(_post(server, path, {**body, "stream": True}))
        assert not any("prompt_token_ids" in c or any(
            "token_ids" in x or "prompt_token_ids" in x for x in c["choices"]) for c in chunks)


@pytest.mark.parametrize("value", ["true", 1, [True], {"on": True}])
def test_a_non_boolean_is_a_400_naming_the_field(server, value):
    model = _model(server)
    for path, body in (("/v1/completions", {"prompt": PROMPT}),
                       ("/v1/chat/completions", {"messages": MESSAGES})):
        r = _post(server, path, {"model": model, "return_token_ids": value, **body})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "return_token_ids" and "return_token_ids" in error["message"]


# -- --stream-interval, run-batch -----------------------------------------------------------

def test_joined_pieces_keep_their_ids(tiny_chat_model, tmp_path):
    s = start_server(tiny_chat_model, "inproc", tmp_path, extra_args=("--stream-interval", "3"))
    try:
        client = s.client()
        kw = _completion(s, extra_body={**ON, **AS_IDS, "ignore_eos": True})
        whole = client.completions.create(**kw).choices[0]
        chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw)]
        assert [len(_extra(c)["token_ids"]) for c in chunks] == [1, 3, 3, 1]
        assert [t for c in chunks for t in _extra(c)["token_ids"]] == whole.token_ids
        kw = _chat(s, None, {"ignore_eos": True}, max_tokens=8)
        whole = _extra(client.chat.completions.create(**kw).choices[0])["token_ids"]
        pieces = [_extra(c.choices[0])["token_ids"]
                  for c in client.chat.completions.create(stream=True, **kw)
                  if "token_ids" in _extra(c.choices[0])]
        assert [len(p) for p in pieces] == [1, 3, 3, 1]
        assert [t for p in pieces for t in p] == whole
    finally:
        assert s.stop() == 0, s.log_tail()


def test_run_batch_answers_with_ids(tiny_chat_model, tmp_path, tokenizer):
    lines = [{"custom_id": "c", "url": "/v1/completions",
              "body": {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True, **ON}},
             {"custom_id": "chat", "url": "/v1/chat/completions",
              "body": {"messages": MESSAGES, "max_tokens": 4, "ignore_eos": True, **ON}},
             {"custom_id": "bad", "url": "/v1/completions",
              "body": {"prompt": PROMPT, "return_token_ids": "yes"}}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"method": "POST", **line}) + "\n"
                                               for line in lines))
    assert main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out.jsonl"),
                 "--model", tiny_chat_model, "--disable-frontend-multiprocessing", "--dtype",
                 "float32", "--device", "cpu", "--max-model-len", "1024",
                 "--kv-cache-memory-bytes", str(32 * 1024 * 1024)]) == 0
    out = {r["custom_id"]: r for r in map(json.loads, (tmp_path / "out.jsonl").open())}
    completion = out["c"]["response"]["body"]["choices"][0]
    assert completion["prompt_token_ids"] == tokenizer.encode(PROMPT).ids
    assert tokenizer.decode(completion["token_ids"]) == completion["text"]
    chat = out["chat"]["response"]["body"]
    assert len(chat["prompt_token_ids"]) == chat["usage"]["prompt_tokens"]
    assert len(chat["choices"][0]["token_ids"]) == 4
    assert out["bad"]["response"]["status_code"] == 400
    assert out["bad"]["error"]["error"]["param"] == "return_token_ids"
