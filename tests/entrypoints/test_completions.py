"""/v1/completions against `LLM.generate` on the same model: text and token-id prompts,
streaming and not, n=2, seeds, logprobs (and echo'd prompt logprobs, as lm-eval reads
them), stop strings, usage."""

from __future__ import annotations

import json

import httpx
import pytest

from loom import SamplingParams
from tests.entrypoints.conftest import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}

PROMPTS = ["The quick brown fox", "Hello, my name is"]
TOKEN_PROMPT = [1, 504, 3458, 1178, 28, 253, 2491, 30]


def _greedy(**kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True, **kw)


def _offline(llm, prompt, params):
    return llm.generate(prompt, params, use_tqdm=False)[0]


def test_text_and_token_prompts_equal_llm(server, llm):
    client = server.client()
    response = client.completions.create(model=server_model(server), prompt=PROMPTS,
                                         max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    assert [c.index for c in response.choices] == [0, 1]
    for prompt, choice in zip(PROMPTS, response.choices):
        expected = _offline(llm, prompt, _greedy(max_tokens=12)).outputs[0]
        assert choice.text == expected.text
        assert choice.finish_reason == "length"
    by_ids = client.completions.create(model=server_model(server), prompt=TOKEN_PROMPT,
                                       max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    assert by_ids.choices[0].text == _offline(llm, TOKEN_PROMPT, _greedy(max_tokens=8)).outputs[0].text
    assert by_ids.usage.prompt_tokens == len(TOKEN_PROMPT)
    assert by_ids.usage.completion_tokens == 8


def test_stream_equals_whole_with_usage(server):
    client = server.client()
    kwargs = dict(model=server_model(server), prompt=PROMPTS[0], max_tokens=16, temperature=0,
                  extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True},
                                            **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_n2_seeded_is_reproducible_and_equals_llm(server, llm):
    client = server.client()
    kwargs = dict(model=server_model(server), prompt=PROMPTS[1], max_tokens=10, n=2, seed=1234,
                  temperature=1.0, top_p=0.9, extra_body={"ignore_eos": True, "top_k": 50})
    first = client.completions.create(**kwargs)
    second = client.completions.create(**kwargs)
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert first.choices[0].text != first.choices[1].text
    offline = _offline(llm, PROMPTS[1], SamplingParams(n=2, seed=1234, temperature=1.0, top_p=0.9,
                                                       top_k=50, max_tokens=10, ignore_eos=True))
    assert [c.text for c in first.choices] == [o.text for o in offline.outputs]
    streamed = ["", ""]
    for chunk in client.completions.create(stream=True, **kwargs):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == [c.text for c in first.choices]


def test_logprobs_equal_llm(server, llm):
    client = server.client()
    response = client.completions.create(model=server_model(server), prompt=PROMPTS[0], max_tokens=5,
                                         temperature=0, logprobs=3, extra_body={"ignore_eos": True})
    logprobs = response.choices[0].logprobs
    expected = _offline(llm, PROMPTS[0], _greedy(max_tokens=5, logprobs=3)).outputs[0]
    assert len(logprobs.tokens) == 5
    for got, token_id, position in zip(logprobs.token_logprobs, expected.token_ids, expected.logprobs):
        assert got == pytest.approx(position[token_id].logprob, abs=1e-4)
    for top in logprobs.top_logprobs:
        assert 3 <= len(top) <= 4  # the top 3, plus the chosen token when it is not among them
    assert "".join(logprobs.tokens) == response.choices[0].text


def test_echo_prompt_logprobs_as_lm_eval_reads_them(server, llm):
    """lm-eval's local-completions: token-id prompts, echo, logprobs=1, max_tokens=1, then
    token_logprobs[ctxlen:-1] and top_logprobs[ctxlen:-1]."""
    client = server.client()
    long = [(7 * i) % 4000 + 3 for i in range(40)]
    # The third and fourth share two full KV blocks with the second: prefix-cache hits.
    prompts = [TOKEN_PROMPT, long, long, long[:36] + [9, 10, 11]]
    response = client.completions.create(model=server_model(server), prompt=prompts, max_tokens=1,
                                         temperature=0, logprobs=1, echo=True, seed=1234)
    for prompt, choice in zip(prompts, sorted(response.choices, key=lambda c: c.index)):
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(prompt) + 1
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        offline = _offline(llm, prompt, _greedy(max_tokens=1, prompt_logprobs=1))
        for k in range(1, len(prompt)):
            assert lp.token_logprobs[k] == pytest.approx(
                offline.prompt_logprobs[k][prompt[k]].logprob, abs=1e-4)
            assert max(lp.top_logprobs[k].values()) >= lp.token_logprobs[k] - 1e-6
        assert choice.text.startswith(llm.get_tokenizer().decode(prompt, skip_special_tokens=False))


def _check_prompt_logprobs(got: list, offline: list, prompt_ids: list[int], k: int) -> None:
    """vLLM's shape, {token id (a JSON string): {logprob, rank, decoded_token}}, with the
    offline LLM's values (themselves checked against transformers in tests/e2e)."""
    assert got[0] is None and len(got) == len(prompt_ids) == len(offline)
    for pos in range(1, len(prompt_ids)):
        entry = {int(t): v for t, v in got[pos].items()}
        assert str(prompt_ids[pos]) in got[pos] and k <= len(entry) <= k + 1
        for token_id, value in entry.items():
            want = offline[pos][token_id]
            assert value["logprob"] == pytest.approx(want.logprob, abs=1e-4)
            assert value["rank"] == want.rank and isinstance(value["decoded_token"], str)


def test_prompt_logprobs_as_vllm_returns_them(server, llm, tiny_chat_model):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=60) as http:
        r = http.post("/v1/completions", json={"prompt": TOKEN_PROMPT, "max_tokens": 1,
                                               "prompt_logprobs": 2, "n": 2})
        assert r.status_code == 200, r.text
        offline = _offline(llm, TOKEN_PROMPT, _greedy(max_tokens=1, prompt_logprobs=2))
        for choice in r.json()["choices"]:
            _check_prompt_logprobs(choice["prompt_logprobs"], offline.prompt_logprobs,
                                   TOKEN_PROMPT, 2)
        messages = [{"role": "user", "content": "Hello there"}]
        r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1,
                                                    "prompt_logprobs": 1})
        assert r.status_code == 200, r.text
        ids = llm.chat_prompt_ids(messages)
        offline = _offline(llm, ids, _greedy(max_tokens=1, prompt_logprobs=1))
        _check_prompt_logprobs(r.json()["prompt_logprobs"], offline.prompt_logprobs, ids, 1)
        plain = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).json()
        assert plain["choices"][0]["prompt_logprobs"] is None


def test_logit_bias_and_allowed_token_ids_as_offline(server, llm):
    client = server.client()
    bias = {1000: 9.0, 2024: 7.0, 30: -100.0}
    response = client.completions.create(
        model=server_model(server), prompt=TOKEN_PROMPT, max_tokens=6, temperature=0,
        logit_bias={str(t): b for t, b in bias.items()}, extra_body={"ignore_eos": True})
    offline = _offline(llm, TOKEN_PROMPT, _greedy(max_tokens=6, logit_bias=bias))
    assert response.choices[0].text == offline.outputs[0].text
    allowed = [253, 504, 1178, 2491]
    response = client.completions.create(
        model=server_model(server), prompt=TOKEN_PROMPT, max_tokens=5, temperature=1.0, seed=3,
        extra_body={"allowed_token_ids": allowed, "ignore_eos": True})
    offline = _offline(llm, TOKEN_PROMPT, SamplingParams(
        temperature=1.0, seed=3, max_tokens=5, ignore_eos=True, allowed_token_ids=allowed))
    assert set(offline.outputs[0].token_ids) <= set(allowed)
    assert response.choices[0].text == offline.outputs[0].text


def test_truncate_prompt_tokens_generates_from_the_last_tokens(server, llm):
    client = server.client()
    response = client.completions.create(
        model=server_model(server), prompt=TOKEN_PROMPT, max_tokens=5, temperature=0, echo=True,
        extra_body={"truncate_prompt_tokens": 3, "ignore_eos": True})
    kept = TOKEN_PROMPT[-3:]
    offline = _offline(llm, kept, _greedy(max_tokens=5))
    echoed = llm.get_tokenizer().decode(kept, skip_special_tokens=False)
    assert response.choices[0].text == echoed + offline.outputs[0].text
    assert response.usage.prompt_tokens == 3
    chat = client.chat.completions.create(
        model=server_model(server), messages=[{"role": "user", "content": "Hello there"}],
        max_tokens=2, extra_body={"truncate_prompt_tokens": 5})
    assert chat.usage.prompt_tokens == 5


def test_bad_words_as_offline(server, llm):
    client = server.client()
    plain = _offline(llm, TOKEN_PROMPT, _greedy(max_tokens=6)).outputs[0]
    tok = llm.get_tokenizer()

    def banned(word: str) -> list[list[int]]:
        return llm.processor.process("w", [1], SamplingParams(
            bad_words=[word])).sampling_params.bad_words_token_ids
    # A token of the greedy output that its word, as bad, bans on its own.
    k, words = next((k, [tok.decode([t]).strip()]) for k, t in enumerate(plain.token_ids)
                    if tok.decode([t]).strip() and [t] in banned(tok.decode([t]).strip()))
    offline = _offline(llm, TOKEN_PROMPT, _greedy(max_tokens=6, bad_words=words)).outputs[0]
    assert offline.token_ids[:k + 1] != plain.token_ids[:k + 1]
    response = client.completions.create(
        model=server_model(server), prompt=TOKEN_PROMPT, max_tokens=6, temperature=0,
        extra_body={"bad_words": words, "ignore_eos": True})
    assert response.choices[0].text == offline.text


def test_return_tokens_as_token_ids(server, llm):
    """vLLM's spelling of each logprob's token, "token_id:<id>", on both endpoints: the ids
    are the ones the offline LLM samples."""
    client = server.client()
    offline = _offline(llm, TOKEN_PROMPT, _greedy(max_tokens=4, logprobs=2))
    response = client.completions.create(
        model=server_model(server), prompt=TOKEN_PROMPT, max_tokens=4, temperature=0,
        logprobs=2, extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
    lp = response.choices[0].logprobs
    assert lp.tokens == [f"token_id:{t}" for t in offline.outputs[0].token_ids]
    assert all(all(k.startswith("token_id:") for k in top) for top in lp.top_logprobs)
    chat = client.chat.completions.create(
        model=server_model(server), messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        temperature=0, logprobs=True, top_logprobs=2,
        extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
    ids = llm.chat_prompt_ids([{"role": "user", "content": "hi"}])
    expected = _offline(llm, ids, _greedy(max_tokens=3)).outputs[0].token_ids
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == [f"token_id:{t}" for t in expected]
    assert content[0].bytes == list(content[0].token.encode())
    assert all(t.token.startswith("token_id:") for c in content for t in c.top_logprobs)


def test_stop_string_cuts_the_text(server):
    client = server.client()
    kwargs = dict(model=server_model(server), prompt=PROMPTS[0], max_tokens=24, temperature=0,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), f"need a visible stop string in {full!r}"
    cut = client.completions.create(stop=[stop], **kwargs).choices[0]
    assert cut.text == full[:full.index(stop)]
    assert cut.finish_reason == "stop" and cut.stop_reason == stop
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, stop=stop,
                                                                             **kwargs))
    assert streamed == cut.text


def server_model(server) -> str:
    return server.client().models.list().data[0].id


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "Once upon", "max_tokens": 5}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}),
], ids=["completions", "chat"])
def test_continuous_usage_stats_on_every_chunk(server, path, body):
    """vLLM's stream_options.continuous_usage_stats: each chunk carries the usage so far,
    and the last (choice-less) chunk the total."""
    body = {**body, "stream": True, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as http:
        with http.stream("POST", path, json=body) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
    assert events and all(e.get("usage") for e in events), events
    prompt = {e["usage"]["prompt_tokens"] for e in events}
    assert len(prompt) == 1 and prompt.pop() > 0
    done = [e["usage"]["completion_tokens"] for e in events]
    assert done == sorted(done) and done[-1] == 5
    assert events[-1]["choices"] == []
    assert all(e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"]
               + e["usage"]["completion_tokens"] for e in events)


def test_cache_salt_and_cached_tokens_in_usage(parsing_server, server):
    """--enable-prompt-tokens-details counts the prompt tokens served from the prefix cache;
    vLLM's cache_salt shares them only between requests with the same salt."""
    client = parsing_server.client()
    model = server_model(parsing_server)
    # Four full 16-token blocks and more, new to the (session-wide) server on each run, as
    # are the salts: the test runs once per frontend mode of `server`.
    run = server.mode
    start = {"inproc": 0, "mp": 1000, "mp2": 2000, "dp2": 1500}[run]
    prompt = [(11 * i + start) % 3000 + 7 for i in range(70)]

    def cached(salt=None, **kw) -> int:
        extra = {} if salt is None else {"cache_salt": salt}
        out = client.completions.create(model=model, prompt=prompt, max_tokens=1,
                                         extra_body=extra, **kw)
        if kw.get("stream"):
            out = [c for c in out if c.usage][-1]
        return out.usage.prompt_tokens_details.cached_tokens

    a, b = f"tenant-a-{run}", f"tenant-b-{run}"
    first = cached(a)
    assert cached(a) >= 64 > first
    assert cached(b) == 0 and cached() == 0 and cached() >= 64
    assert cached(a, stream=True, stream_options={"include_usage": True}) >= 64
    chat = client.chat.completions.create(model=model, max_tokens=1,
                                          messages=[{"role": "user", "content": "hi " * 40}])
    assert chat.usage.prompt_tokens_details.cached_tokens >= 0
    plain = server.client().completions.create(model=server_model(server), prompt="x",
                                               max_tokens=1)
    assert plain.usage.prompt_tokens_details is None  # without the flag
    r = httpx.post(f"{parsing_server.url}/v1/completions", json={
        "prompt": "x", "cache_salt": ""}, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_use_beam_search_as_offline(server, llm):
    """vLLM's use_beam_search: the n beams of LLM.beam_search (itself checked against
    transformers' num_beams in tests/e2e), best first, on both endpoints."""
    from loom import BeamSearchParams
    client = server.client()
    offline = llm.beam_search([{"prompt_token_ids": TOKEN_PROMPT}],
                              BeamSearchParams(beam_width=3, max_tokens=5, ignore_eos=True))[0]
    response = client.completions.create(
        model=server_model(server), prompt=TOKEN_PROMPT, max_tokens=5, n=3,
        extra_body={"use_beam_search": True, "ignore_eos": True})
    choices = sorted(response.choices, key=lambda c: c.index)
    assert [c.text for c in choices] == [s.text for s in offline.sequences]
    assert response.usage.completion_tokens == 15
    messages = [{"role": "user", "content": "hi"}]
    ids = llm.chat_prompt_ids(messages)
    offline = llm.beam_search([{"prompt_token_ids": ids}],
                              BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True))[0]
    chat = client.chat.completions.create(model=server_model(server), messages=messages,
                                          max_tokens=4, n=2,
                                          extra_body={"use_beam_search": True,
                                                      "ignore_eos": True})
    assert [c.message.content for c in chat.choices] == [s.text for s in offline.sequences]
    for bad in ({"stream": True}, {"n": 11}):  # 22 logprobs a round, over max_logprobs 20
        r = httpx.post(f"{server.url}/v1/completions", json={
            "prompt": ["x", "y"], "use_beam_search": True, **bad},
            headers={"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "use_beam_search", r.text
    assert server.introspect()["engine_unfinished"] == 0


def test_priority_needs_the_priority_policy(parsing_server, server):
    """vLLM's priority field: taken by a server with --scheduling-policy priority (as
    parsing_server runs), a 400 naming it from one without (fcfs), for both endpoints."""
    import openai
    messages = [{"role": "user", "content": "hi"}]
    prio = parsing_server.client()
    out = prio.completions.create(model=server_model(parsing_server), prompt="x", max_tokens=2,
                                  extra_body={"priority": -5})
    assert out.choices[0].finish_reason == "length"
    chat = prio.chat.completions.create(model=server_model(parsing_server), messages=messages,
                                        max_tokens=2, extra_body={"priority": 3})
    assert chat.choices[0].finish_reason == "length"
    fcfs, model = server.client(), server_model(server)
    with pytest.raises(openai.BadRequestError, match="Priority scheduling is not enabled") as e:
        fcfs.completions.create(model=model, prompt="x", max_tokens=2, extra_body={"priority": 1})
    assert e.value.body["param"] == "priority"
    with pytest.raises(openai.BadRequestError, match="Priority scheduling is not enabled"):
        fcfs.chat.completions.create(model=model, messages=messages, max_tokens=2,
                                     extra_body={"priority": 1})
    with pytest.raises(openai.BadRequestError, match="priority"):
        prio.completions.create(model=server_model(parsing_server), prompt="x", max_tokens=2,
                                extra_body={"priority": "high"})
    # /v1/responses takes it too (it reached nothing before: silently dropped).
    assert prio.responses.create(model=server_model(parsing_server), input="hi",
                                 max_output_tokens=2, extra_body={"priority": 2}).status
    with pytest.raises(openai.BadRequestError, match="Priority scheduling is not enabled"):
        fcfs.responses.create(model=model, input="hi", max_output_tokens=2,
                              extra_body={"priority": 1})
    with pytest.raises(openai.BadRequestError, match="Priority scheduling is not enabled"):
        fcfs.chat.completions.create(model=model, messages=messages, max_tokens=2, n=2,
                                     extra_body={"priority": 1, "use_beam_search": True})
    assert fcfs.completions.create(model=model, prompt="x", max_tokens=2,
                                   extra_body={"priority": 0}).choices


def test_vllm_xargs_reach_the_custom_logits_processor(parsing_server, server):
    """vllm_xargs become the request's SamplingParams.extra_args, which the server's
    --logits-processors class reads (tests/engine/logits_procs.py: TargetToken makes the
    target the only token); its validate_params refuses bad ones with a 400."""
    import openai
    client, model = parsing_server.client(), server_model(parsing_server)
    out = client.completions.create(model=model, prompt="Once upon", max_tokens=4,
                                    extra_body={"vllm_xargs": {"target_token": 77},
                                                "return_token_ids": True, "ignore_eos": True})
    assert out.choices[0].token_ids == [77] * 4
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        extra_body={"vllm_xargs": {"target_token": 78}, "return_token_ids": True,
                    "ignore_eos": True})
    assert chat.choices[0].token_ids == [78] * 3
    plain = client.completions.create(model=model, prompt="Once upon", max_tokens=4,
                                      temperature=0, extra_body={"return_token_ids": True})
    assert plain.choices[0].token_ids != [77] * 4  # others are left alone
    for xargs, match in (({"target_token": "x"}, "target_token: must be a token id"),
                         ({"target_token": {"a": 1}}, "vllm_xargs")):
        with pytest.raises(openai.BadRequestError, match=match):
            client.completions.create(model=model, prompt="x", max_tokens=2,
                                      extra_body={"vllm_xargs": xargs})
    # A server without processors takes vllm_xargs too (nothing reads them), as vLLM's does.
    assert server.client().completions.create(
        model=server_model(server), prompt="x", max_tokens=2,
        extra_body={"vllm_xargs": {"target_token": 77}}).choices[0].finish_reason == "length"
