"""/v1/chat/completions against `LLM.chat`, and the small endpoints: models, version,
tokenize, detokenize, metrics, health."""

from __future__ import annotations

import os

import httpx
import pytest
from tokenizers import Tokenizer as HFTokenizer

from loom import SamplingParams
from tests.entrypoints.conftest import API_KEY, MAX_MODEL_LEN

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three colours."}]


def _model(server) -> str:
    return server.client().models.list().data[0].id


def test_chat_equals_llm_chat_streamed_or_not(server, llm):
    client = server.client()
    kwargs = dict(model=_model(server), messages=MESSAGES, max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs)
    expected = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                        use_tqdm=False)[0]
    assert whole.choices[0].message.content == expected.outputs[0].text
    assert whole.choices[0].message.role == "assistant"
    assert whole.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert whole.usage.completion_tokens == 12
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                 **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


@pytest.mark.parametrize("server", ["inproc"], indirect=True)
def test_echo_puts_the_continued_message_first(server, llm):
    """vLLM's echo: a continued final message's text starts the reply (streamed too); the
    continuation is what LLM.chat writes. A user's message before an assistant's reply is
    not echoed (the roles differ)."""
    client = server.client()
    messages = [{"role": "user", "content": "Tell a story."},
                {"role": "assistant", "content": [{"type": "text", "text": "Once"},
                                                  {"type": "text", "text": "upon"}]}]
    kwargs = dict(model=_model(server), messages=messages, max_tokens=5, temperature=0,
                  extra_body={"ignore_eos": True, "echo": True, "add_generation_prompt": False,
                              "continue_final_message": True})
    expected = llm.chat(messages, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                        use_tqdm=False, add_generation_prompt=False,
                        continue_final_message=True)[0].outputs[0].text
    whole = client.chat.completions.create(**kwargs)
    assert whole.choices[0].message.content == "Once\nupon" + expected
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Once\nupon" + expected
    plain = client.chat.completions.create(**{**kwargs, "messages": messages[:1],
                                              "extra_body": {"ignore_eos": True, "echo": True}})
    assert not plain.choices[0].message.content.startswith("Tell a story.")


def test_chat_n2_logprobs_and_stop(server, llm):
    client = server.client()
    response = client.chat.completions.create(
        model=_model(server), messages=MESSAGES, max_tokens=6, n=2, seed=7, temperature=0.8,
        logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    assert len(response.choices) == 2
    offline = llm.chat(MESSAGES, SamplingParams(n=2, seed=7, temperature=0.8, max_tokens=6,
                                                ignore_eos=True, logprobs=2), use_tqdm=False)[0]
    for choice, expected in zip(response.choices, offline.outputs):
        assert choice.message.content == expected.text
        content = choice.logprobs.content
        assert len(content) == 6
        for entry, token_id, position in zip(content, expected.token_ids, expected.logprobs):
            assert entry.logprob == pytest.approx(position[token_id].logprob, abs=1e-4)
            assert len(entry.top_logprobs) == 2
            assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob
    full = response.choices[0].message.content
    stop = full[-3:] if full[-3:].strip() else full[:3]
    if stop.strip():
        cut = client.chat.completions.create(model=_model(server), messages=MESSAGES, max_tokens=6,
                                             n=2, seed=7, temperature=0.8, stop=[stop],
                                             extra_body={"ignore_eos": True})
        assert cut.choices[0].message.content == full[:full.index(stop)]
        assert cut.choices[0].finish_reason == "stop"


def test_models_version_tokenize_detokenize(server, llm, tiny_chat_model):
    client = server.client()
    models = client.models.list().data
    assert len(models) == 1 and models[0].max_model_len == MAX_MODEL_LEN
    base = server.url
    assert httpx.get(f"{base}/version").json()["version"]
    tokens = httpx.post(f"{base}/tokenize", json={"prompt": "Hello world"}).json()
    assert tokens["tokens"] == llm.get_tokenizer().encode("Hello world")
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == MAX_MODEL_LEN
    chat = httpx.post(f"{base}/tokenize", json={"messages": MESSAGES}).json()
    assert chat["tokens"] == llm.chat_prompt_ids(MESSAGES)
    text = httpx.post(f"{base}/detokenize", json={"tokens": chat["tokens"]}).json()["prompt"]
    # As vLLM: special tokens stay (a rendered chat comes back whole).
    hf = HFTokenizer.from_file(os.path.join(tiny_chat_model, "tokenizer.json"))
    assert text == hf.decode(chat["tokens"], skip_special_tokens=False)
    assert "<|im_start|>" in text


def test_metrics_and_health(server):
    client = server.client()
    client.completions.create(model=_model(server), prompt="count", max_tokens=4,
                              extra_body={"ignore_eos": True})
    assert httpx.get(f"{server.url}/health").status_code == 200
    text = httpx.get(f"{server.url}/metrics").text
    for name in ["loom:num_requests_running", "loom:num_requests_waiting",
                 "loom:kv_cache_usage_perc", "loom:prefix_cache_queries_total",
                 "loom:prefix_cache_hits_total", "loom:prompt_tokens_total",
                 "loom:generation_tokens_total", "loom:time_to_first_token_seconds_bucket",
                 "loom:inter_token_latency_seconds_bucket", "loom:e2e_request_latency_seconds_count",
                 "loom:request_queue_time_seconds_count",
                 "loom:request_prefill_time_seconds_count"]:
        assert name in text, name
    assert _sample(text, "loom:request_prefill_time_seconds_count") >= 1
    generated = _sample(text, "loom:generation_tokens_total")
    assert generated >= 4


def _sample(text: str, name: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert values, name
    return sum(values)


def test_api_key_is_required_on_v1_only(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.get(f"{server.url}/v1/models", headers=headers)
        assert r.status_code == 401
        assert set(r.json()["error"]) >= {"message", "type", "param", "code"}
    ok = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_api_server_process_never_imports_torch(server):
    info = server.introspect()
    assert info["torch_loaded"] == (server.mode == "inproc"), info


def test_tool_call_turns_and_template_variables_reach_the_template(server, tiny_chat_model):
    """An assistant turn with content null (OpenAI's shape for a turn that only calls tools)
    renders as empty content, as vLLM does; chat_template_kwargs and tools with tool_choice
    "none" are the template's variables. Checked against transformers' own rendering."""
    import transformers as tf
    hf = tf.AutoTokenizer.from_pretrained(tiny_chat_model)
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    sent = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "1", "content": "42"}]
    rendered = [dict(m, content=m["content"] or "") for m in sent]
    text = hf.apply_chat_template(rendered, add_generation_prompt=True, tokenize=False)
    expected = hf(text, add_special_tokens=False)["input_ids"]
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=60) as http:
        tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        r = http.post("/v1/chat/completions", json={
            "messages": sent, "max_tokens": 2, "tools": tools, "tool_choice": "none",
            "chat_template_kwargs": {"enable_thinking": False}})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == len(expected)


def test_render_passes_template_variables(tiny_chat_model):
    from types import SimpleNamespace

    from loom.entrypoints.openai.protocol_chat import ChatCompletionRequest
    from loom.entrypoints.openai.serving_chat import OpenAIServingChat
    from loom.frontend.tokenizer import load_tokenizer
    template = ("{% if enable_thinking is defined and not enable_thinking %}[quiet]{% endif %}"
                "{% if tools %}[{{ tools | length }} tools]{% endif %}"
                "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }};{% endfor %}")
    tokenizer = load_tokenizer(tiny_chat_model, chat_template=template)
    chat = OpenAIServingChat(SimpleNamespace(tokenizer=tokenizer), ["m"])
    body = ChatCompletionRequest.model_validate({
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}],
        "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "none",
        "chat_template_kwargs": {"enable_thinking": False}})
    ids = chat.render(body.messages, False, False, body.template_variables)
    assert tokenizer.decode(ids) == "[quiet][1 tools]user:hi;assistant:;"


def test_llm_chat_outputs_carry_the_rendered_prompt(llm, tiny_chat_model):
    import transformers as tf
    hf = tf.AutoTokenizer.from_pretrained(tiny_chat_model)
    out = llm.chat(MESSAGES, SamplingParams(max_tokens=1), use_tqdm=False)[0]
    assert out.prompt == hf.apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                tokenize=False)


def test_llm_chat_takes_tools_template_kwargs_and_continues_the_final_message(llm,
                                                                            tiny_chat_model):
    """vLLM's LLM.chat keywords, rendered as transformers renders them."""
    import transformers as tf
    hf = tf.AutoTokenizer.from_pretrained(tiny_chat_model)
    template = ("{% if enable_thinking is defined and not enable_thinking %}[quiet]{% endif %}"
                "{% if tools %}[tools: {{ tools[0]['function']['name'] }}]{% endif %}"
                "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "It is"}]
    out = llm.chat(messages, SamplingParams(max_tokens=1), use_tqdm=False,
                   chat_template=template, add_generation_prompt=False,
                   continue_final_message=True, tools=tools,
                   chat_template_kwargs={"enable_thinking": False})[0]
    assert out.prompt == hf.apply_chat_template(
        messages, tools=tools, chat_template=template, tokenize=False,
        add_generation_prompt=False, continue_final_message=True, enable_thinking=False)
    with pytest.raises(ValueError, match="continue_final_message: set add_generation_prompt"):
        llm.chat(messages, continue_final_message=True, use_tqdm=False, chat_template=template)
    with pytest.raises(ValueError, match="tools.0.type"):
        llm.chat(messages, tools=[{"type": "web"}], use_tqdm=False, chat_template=template)


def test_request_chat_template_and_documents(parsing_server, tiny_chat_model):
    """With --trust-request-chat-template a request's own template renders its messages and
    documents, as transformers renders them; a server without the flag refuses it (see
    test_errors)."""
    import transformers as tf
    hf = tf.AutoTokenizer.from_pretrained(tiny_chat_model)
    template = ("{% for d in documents %}[{{ d['title'] }}: {{ d['text'] }}]{% endfor %}"
                "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")
    messages = [{"role": "user", "content": "Summarise."}]
    documents = [{"title": "a", "text": "one"}, {"title": "b", "text": "two"}]
    text = hf.apply_chat_template(messages, documents=documents, chat_template=template,
                                  tokenize=False, add_generation_prompt=True)
    with httpx.Client(base_url=parsing_server.url,
                      headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as http:
        r = http.post("/v1/chat/completions", json={
            "messages": messages, "max_tokens": 1, "chat_template": template,
            "documents": documents})
        assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(hf(text, add_special_tokens=False)["input_ids"])


def test_cors_as_vllm_defaults(server):
    """Browser clients: a preflight (no API key) is answered, and responses carry
    Access-Control-Allow-Origin, as vLLM's default CORS (any origin)."""
    origin = {"Origin": "http://localhost:3000"}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        pre = http.options("/v1/chat/completions", headers={
            **origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type"})
        assert pre.status_code == 200, pre.text
        assert pre.headers["access-control-allow-origin"] in ("*", origin["Origin"])
        assert "POST" in pre.headers["access-control-allow-methods"]
        r = http.get("/v1/models", headers={**origin, "Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


def test_cors_flags_take_json_lists(capsys):
    from loom.cli import build_parser
    from tests.test_cli import _main_error
    args = build_parser().parse_args(["serve", "--allowed-origins", '["http://a.example"]',
                                      "--allow-credentials"])
    assert args.allowed_origins == ["http://a.example"] and args.allow_credentials
    assert args.allowed_methods == ["*"]
    assert "must be a JSON list of strings" in _main_error(capsys, "serve", "--allowed-origins",
                                                           "http://a.example")


def test_tokenize_renders_messages_as_chat_does(server, tiny_chat_model):
    """vLLM's /tokenize fields for messages (tools, chat_template_kwargs,
    continue_final_message) and return_token_strs, against transformers."""
    import transformers as tf
    hf = tf.AutoTokenizer.from_pretrained(tiny_chat_model)
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "It is"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    text = hf.apply_chat_template(messages, tools=tools, tokenize=False,
                                  add_generation_prompt=False, continue_final_message=True,
                                  enable_thinking=False)
    expected = hf(text, add_special_tokens=False)["input_ids"]
    r = httpx.post(f"{server.url}/tokenize", json={
        "messages": messages, "tools": tools, "add_generation_prompt": False,
        "continue_final_message": True, "chat_template_kwargs": {"enable_thinking": False},
        "return_token_strs": True}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == expected
    assert body["token_strs"] == hf.convert_ids_to_tokens(expected)
    bad = httpx.post(f"{server.url}/tokenize", json={"messages": messages,
                                                    "chat_template": "{{ 1 }}"}, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template"


def test_nulls_the_openai_spec_allows_mean_the_default(server):
    """The openai client sends null for an argument given as None; OpenAI's spec allows it
    for n, stream, echo and logprobs, meaning their default."""
    client = server.client()
    model = _model(server)
    whole = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=3,
                                           temperature=0, n=None, stream=None, logprobs=None)
    plain = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=3,
                                           temperature=0)
    assert len(whole.choices) == 1 and whole.choices[0].logprobs is None
    assert whole.choices[0].message.content == plain.choices[0].message.content
    text = client.completions.create(model=model, prompt="Hi", max_tokens=2, n=None,
                                     stream=None, echo=None, logprobs=None, temperature=0)
    assert len(text.choices) == 1 and text.choices[0].logprobs is None
    assert not text.choices[0].text.startswith("Hi")
