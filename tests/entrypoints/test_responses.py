"""/v1/responses through the official openai client, against references nobody here wrote:
the same conversation's /v1/chat/completions and `LLM.chat` text, transformers' rendering of
the turns a response continues, the client's own stream helper (`responses.stream()`, which
checks the events' consistency and assembles the final response) and its pydantic parsing
of structured output. The random model's text is steered with `forced(...)` where what it
writes must be known (tool calls, thinking, completed responses)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from pydantic import BaseModel

from loom import SamplingParams
from tests.entrypoints.conftest import API_KEY, MAX_MODEL_LEN, forced

INSTRUCTIONS = "You are terse."
QUESTION = "Name three colours."
MESSAGES = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
TOOLS = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
          "parameters": {"type": "object", "required": ["city"],
                         "properties": {"city": {"enum": ["Paris", "Rome"]}}}},
         {"type": "function", "name": "now", "description": "The time"}]
CALL_TEXT = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}'
             '\n</tool_call>')


def _model(server) -> str:
    return server.client().models.list().data[0].id


def _same(response) -> dict:
    """A response without what differs between two runs of one request (ids, times, and
    the prompt tokens the first left in the prefix cache)."""
    data = response.model_dump(exclude={"id", "created_at"})
    data["usage"]["input_tokens_details"].pop("cached_tokens")
    for item in data["output"]:
        item.pop("id")
        item.pop("call_id", None)
        item.pop("parsed_arguments", None)  # the stream helper's own additions
        for part in item.get("content") or []:
            part.pop("parsed", None)
    return data


def _hf_prompt_tokens(tiny_chat_model: str, messages: list[dict], tools=None) -> tuple[int, str]:
    import transformers as tf
    hf = tf.AutoTokenizer.from_pretrained(tiny_chat_model)
    text = hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                  tokenize=False)
    return len(hf(text, add_special_tokens=False)["input_ids"]), text


@pytest.mark.parametrize("server", ["inproc", "mp"], indirect=True)
def test_responses_equal_chat_whole_and_streamed(server, llm):
    client = server.client()
    kw = dict(model=_model(server), instructions=INSTRUCTIONS, temperature=0,
              input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
              max_output_tokens=12, extra_body={"ignore_eos": True})
    whole = client.responses.create(**kw)
    chat = client.chat.completions.create(model=kw["model"], messages=MESSAGES, max_tokens=12,
                                          temperature=0, extra_body={"ignore_eos": True})
    offline = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                       use_tqdm=False)[0]
    assert whole.output_text == chat.choices[0].message.content == offline.outputs[0].text
    assert whole.id.startswith("resp_") and whole.object == "response"
    assert (whole.status, whole.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    [message] = whole.output
    assert (message.type, message.role, message.status) == ("message", "assistant", "incomplete")
    assert message.id.startswith("msg_") and message.content[0].annotations == []
    usage = whole.usage
    assert usage.input_tokens == chat.usage.prompt_tokens == len(offline.prompt_token_ids)
    assert (usage.output_tokens, usage.total_tokens) == (12, usage.input_tokens + 12)
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert (whole.instructions, whole.max_output_tokens, whole.temperature, whole.top_p) == (
        INSTRUCTIONS, 12, 0.0, 1.0)
    assert (whole.tool_choice, whole.tools, whole.parallel_tool_calls, whole.store) == (
        "auto", [], True, False)  # without LOOM_ENABLE_RESPONSES_API_STORE nothing is kept
    assert whole.text.format.type == "text"

    events = list(client.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", *["response.output_text.delta"] * deltas,
                     "response.output_text.done", "response.content_part.done",
                     "response.output_item.done", "response.incomplete"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert "".join(e.delta for e in events if e.type.endswith("text.delta")) == whole.output_text
    assert _same(events[-1].response) == _same(whole)

    # A completed response through the client's helper, which checks the events.
    kw = {**kw, "extra_body": forced("Red, green, blue.")}
    whole = client.responses.create(**kw)
    assert (whole.status, whole.output_text, whole.incomplete_details) == (
        "completed", "Red, green, blue.", None)
    with client.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    assert _same(final) == _same(whole)

    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(whole.id)
    with pytest.raises(openai.NotFoundError, match="LOOM_ENABLE_RESPONSES_API_STORE"):
        client.responses.create(**kw, previous_response_id=whole.id)


def test_function_calls_and_their_results(parsing_server, tiny_chat_model):
    client = parsing_server.client()
    kw = dict(model=_model(parsing_server), input="Weather in Paris?", tools=TOOLS,
              temperature=0, max_output_tokens=60, extra_body=forced(CALL_TEXT))
    whole = client.responses.create(**kw)
    assert whole.status == "completed"
    message, call = whole.output
    assert (message.type, message.content[0].text) == ("message", "Checking.\n")
    assert (call.type, call.name, json.loads(call.arguments), call.status) == (
        "function_call", "get_weather", {"city": "Paris"}, "completed")
    assert call.id.startswith("fc_") and call.call_id
    assert [t.name for t in whole.tools] == ["get_weather", "now"]
    with client.responses.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert _same(final) == _same(whole)
    assert kinds.count("response.function_call_arguments.delta") > 1  # as the model writes it
    assert kinds.index("response.function_call_arguments.done") < kinds.index(
        "response.completed")

    named = client.responses.create(**{**kw, "extra_body": None}, parallel_tool_calls=False,
                                    tool_choice={"type": "function", "name": "get_weather"})
    [call_only] = named.output
    assert call_only.name == "get_weather" and named.parallel_tool_calls is False
    assert json.loads(call_only.arguments) in ({"city": "Paris"}, {"city": "Rome"})
    assert named.tool_choice.name == "get_weather"

    # The tool's result goes back as a function_call_output item, rendered as a tool turn.
    result = {"type": "function_call_output", "call_id": call.call_id,
              "output": "22 degrees and sunny"}
    follow = client.responses.create(
        model=kw["model"], tools=TOOLS, max_output_tokens=2, temperature=0,
        input=[{"role": "user", "content": "Weather in Paris?"},
               *[item.model_dump(exclude_none=True) for item in whole.output], result])
    expected, text = _hf_prompt_tokens(tiny_chat_model, [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking.\n", "tool_calls": [
            {"id": call.call_id, "type": "function",
             "function": {"name": "get_weather", "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "22 degrees and sunny"}],
        tools=[{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
               for t in TOOLS])
    assert "22 degrees and sunny" in text
    assert follow.usage.input_tokens == expected

    # The same continuation from the stored response (LOOM_ENABLE_RESPONSES_API_STORE).
    chained = client.responses.create(model=kw["model"], tools=TOOLS, max_output_tokens=2,
                                      temperature=0, previous_response_id=whole.id,
                                      input=[result])
    assert chained.previous_response_id == whole.id
    assert chained.usage.input_tokens == expected


def test_reasoning_becomes_a_reasoning_item(parsing_server):
    client = parsing_server.client()
    kw = dict(model=_model(parsing_server), input="Capital of France?", temperature=0,
              max_output_tokens=40, reasoning={"effort": "low"},
              extra_body=forced("<think>\nIt is in France.\n</think>\n\nParis."))
    whole = client.responses.create(**kw)
    reasoning, message = whole.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
    assert [c.text for c in reasoning.content] == ["\nIt is in France.\n"]
    assert whole.output_text == "Paris."
    details = whole.usage.output_tokens_details
    assert 0 < details.reasoning_tokens < whole.usage.output_tokens
    assert whole.reasoning.effort == "low"
    with client.responses.stream(**kw) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert _same(final) == _same(whole)
    assert "response.reasoning_text.delta" in kinds and "response.reasoning_text.done" in kinds


class Colour(BaseModel):
    colour: str
    count: int


def test_json_schema_text_format(parsing_server):
    client = parsing_server.client()
    schema = {"type": "object", "additionalProperties": False, "required": ["colour", "count"],
              "properties": {"colour": {"enum": ["red", "green"]},
                             "count": {"type": "integer", "minimum": 0, "maximum": 9}}}
    response = client.responses.parse(
        model=_model(parsing_server), input="A colour and a count, as JSON.", temperature=0,
        max_output_tokens=40, text={"format": {"type": "json_schema", "name": "colour",
                                               "schema": schema, "strict": True}})
    assert response.status == "completed"
    parsed = Colour.model_validate_json(response.output_text)
    assert parsed.colour in ("red", "green") and 0 <= parsed.count <= 9
    assert response.text.format.type == "json_schema" and response.text.format.name == "colour"


def test_store_continues_retrieves_and_cancels(parsing_server, tiny_chat_model):
    client = parsing_server.client()
    model = _model(parsing_server)
    first = client.responses.create(model=model, input="My name is Ada.", temperature=0,
                                    max_output_tokens=4, metadata={"topic": "names"},
                                    extra_body={"ignore_eos": True})
    assert first.store is True and first.metadata == {"topic": "names"}
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = client.responses.create(model=model, previous_response_id=first.id,
                                     instructions="Be brief.", input="What is my name?",
                                     max_output_tokens=2)
    expected, _ = _hf_prompt_tokens(tiny_chat_model, [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert second.usage.input_tokens == expected

    unstored = client.responses.create(model=model, input="hi", max_output_tokens=1, store=False)
    assert unstored.store is False
    for bad in (unstored.id, "resp_nothing"):
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.retrieve(bad)
        assert e.value.body["param"] == "response_id"
    with httpx.Client(base_url=parsing_server.url, timeout=30,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        r = http.post(f"/v1/responses/{first.id}/cancel")
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"] == "Cannot cancel a synchronous response."
        assert http.post("/v1/responses/resp_nothing/cancel").status_code == 404


def test_logprobs_equal_chats(parsing_server):
    client = parsing_server.client()
    model = _model(parsing_server)
    response = client.responses.create(
        model=model, input=QUESTION, max_output_tokens=5, temperature=0, top_logprobs=2,
        include=["message.output_text.logprobs"], extra_body={"ignore_eos": True})
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": QUESTION}], max_tokens=5,
        temperature=0, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    got = response.output[0].content[0].logprobs
    want = chat.choices[0].logprobs.content
    assert [(g.token, [t.token for t in g.top_logprobs]) for g in got] == [
        (w.token, [t.token for t in w.top_logprobs]) for w in want]
    assert [g.logprob for g in got] == pytest.approx([w.logprob for w in want], abs=1e-4)
    assert response.top_logprobs == 2


def test_a_dropped_stream_aborts_its_request(parsing_server):
    from tests.entrypoints.test_abort import _wait_idle
    body = {"input": QUESTION, "max_output_tokens": 2000, "stream": True,
            "extra_body": {"ignore_eos": True}}
    client = parsing_server.client()
    stream = client.responses.create(model=_model(parsing_server), **body)
    for _, event in zip(range(6), stream):
        pass
    assert event.type == "response.output_text.delta"
    assert parsing_server.introspect()["engine_unfinished"] == 1
    stream.close()
    info = _wait_idle(parsing_server, 1)
    assert [i["engine_unfinished"] for i in info.values()] == [0], info


@pytest.mark.parametrize("server", ["mp"], indirect=True)
def test_auto_truncation_keeps_the_prompts_tail(server, tiny_chat_model):
    """truncation "auto" (vLLM's): a rendered prompt past the context keeps its last
    max_model_len - max_output_tokens tokens, the tail of transformers' rendering, and
    answers as /v1/completions does from exactly those tokens."""
    import transformers as tf
    client, model = server.client(), _model(server)
    text = "hi " * MAX_MODEL_LEN
    got = client.responses.create(model=model, input=text, truncation="auto",
                                  max_output_tokens=4, temperature=0)
    keep = MAX_MODEL_LEN - 4
    assert got.truncation == "auto" and got.usage.input_tokens == keep, got.usage
    _, rendered = _hf_prompt_tokens(tiny_chat_model, [{"role": "user", "content": text}])
    ids = tf.AutoTokenizer.from_pretrained(tiny_chat_model)(
        rendered, add_special_tokens=False)["input_ids"]
    assert len(ids) > MAX_MODEL_LEN
    want = client.completions.create(model=model, prompt=ids[-keep:], max_tokens=4,
                                     temperature=0)
    assert got.output_text == want.choices[0].text
    # without it, the same input is refused (ERRORS' too-long)


ERRORS = [
    # (id, body, status, param)
    ("unknown-model", {"model": "gpt-9"}, 404, "model"),
    ("built-in-tool", {"tools": [{"type": "web_search"}]}, 400, "tools.0.type"),
    ("background-unstored", {"background": True, "store": False}, 400, "background"),
    ("item-reference", {"input": [{"type": "item_reference", "id": "x"}]}, 400, "input.0.type"),
    ("image", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x"}]}]}, 400, "input.0.content.0.type"),
    ("no-role", {"input": [{"content": "hi"}]}, 400, "input.0.role"),
    ("empty-input", {"input": []}, 400, "input"),
    ("encrypted-reasoning", {"include": ["reasoning.encrypted_content"]}, 400, "include.0"),
    ("unknown-tool-choice", {"tools": TOOLS, "tool_choice": {"type": "function", "name": "x"}},
     400, "tool_choice.name"),
    ("unknown-previous", {"previous_response_id": "resp_nothing"}, 404, "previous_response_id"),
    ("too-long", {"input": "hi " * MAX_MODEL_LEN}, 400, "input"),
    ("negative-max-output", {"max_output_tokens": -1}, 400, "max_output_tokens"),
    ("auto-truncation-no-room", {"truncation": "auto", "max_output_tokens": MAX_MODEL_LEN},
     400, "max_output_tokens"),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_bad_requests_get_openai_errors(parsing_server, case):
    _, body, status, param = case
    with httpx.Client(base_url=parsing_server.url, timeout=30,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        r = http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2, **body})
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["code"] == status, error
        assert error["message"] and "Traceback" not in error["message"]
        assert http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 1}
                         ).status_code == 200


def test_store_is_bounded():
    from loom.entrypoints.openai.protocol_chat import ChatMessage
    from loom.entrypoints.openai.protocol_responses_output import ResponseObject
    from loom.entrypoints.openai.responses_store import ResponseStore, StoredResponse

    def entry(i: int, words: int = 1) -> StoredResponse:
        return StoredResponse.of(ResponseObject(id=f"resp_{i}", created_at=0, status="completed",
                                                model="m"),
                                 [ChatMessage(role="user", content="word " * words)])
    store = ResponseStore(max_responses=3, max_bytes=10**9)
    for i in range(5):
        store.put(entry(i))
    assert store.get("resp_1") is None and store.get("resp_2") is not None
    store.put(entry(5))  # resp_2 was just used: resp_3 goes
    assert [store.get(f"resp_{i}") is not None for i in range(2, 6)] == [True, False, True, True]
    small = entry(0).size
    store = ResponseStore(max_responses=100, max_bytes=small * 3)
    for i in range(3):
        store.put(entry(i))
    big = entry(9, words=small // 10)  # half as big again as the others
    assert small < big.size < 2 * small
    store.put(big)  # over the bytes: the two least recently used go
    assert [store.get(f"resp_{i}") is not None for i in (0, 1, 2, 9)] == [False, False, True, True]
