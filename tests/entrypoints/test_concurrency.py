"""100 concurrent streaming clients: every one completes, no error, and each stream carries
its tokens in order (its text equals the offline `LLM.generate` answer)."""

from __future__ import annotations

import asyncio

from loom import SamplingParams

NUM_CLIENTS = 100
MAX_TOKENS = 12


async def _stream(client, model: str, prompt: str) -> tuple[str, str | None, int]:
    text, finish, usage = "", None, 0
    stream = await client.completions.create(
        model=model, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
    return text, finish, usage


async def _run_all(server, prompts: list[str]) -> list:
    async with server.async_client() as client:
        model = (await client.models.list()).data[0].id
        return await asyncio.gather(*(_stream(client, model, p) for p in prompts))


def test_hundred_concurrent_streams(server, llm):
    prompts = [f"Story number {i}: once upon a time" for i in range(NUM_CLIENTS)]
    results = asyncio.run(_run_all(server, prompts))
    expected = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                    ignore_eos=True), use_tqdm=False)
    for prompt, (text, finish, usage), offline in zip(prompts, results, expected):
        assert finish == "length", prompt
        assert usage == MAX_TOKENS, prompt
        assert text == offline.outputs[0].text, prompt
