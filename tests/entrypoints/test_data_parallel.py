"""`loom serve -dp 2`: two engine core replicas behind each API server. The whole server
suite also runs against one (conftest's dp2 mode); here, what only data parallelism has."""

from __future__ import annotations

import asyncio
import os

import pytest

from loom import SamplingParams
from tests.entrypoints.conftest import start_server

PROMPTS = [f"Replica test {i}: the weather today" for i in range(8)]
MAX_TOKENS = 10


async def _complete_all(server) -> list[str]:
    async with server.async_client() as client:
        model = (await client.models.list()).data[0].id
        answers = await asyncio.gather(*(client.completions.create(
            model=model, prompt=p, max_tokens=MAX_TOKENS, temperature=0,
            extra_body={"ignore_eos": True}) for p in PROMPTS))
    return [a.choices[0].text for a in answers]


def _offline(llm) -> list[str]:
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                                ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].text for o in outs]


def test_requests_spread_over_both_replicas(server, llm):
    if server.mode != "dp2":
        pytest.skip("data parallelism only")
    before = server.introspect()["routed"]
    assert asyncio.run(_complete_all(server)) == _offline(llm) and len(PROMPTS) == 8
    info = server.introspect()
    spread = [after - b for after, b in zip(info["routed"], before)]
    assert spread == [4, 4], spread  # all at once: turn by turn among equals
    pids = info["engine_pids"]
    assert len(set(pids)) == 2 and all(os.path.exists(f"/proc/{p}") for p in pids), pids
    assert info["engine_unfinished"] == 0
    # Each replica has its own KV cache; the server's is both.
    assert info["kv"]["num_blocks"] == info["kv"]["num_free_blocks"] > 0


def test_replicas_behind_several_api_servers(tiny_chat_model, tmp_path, llm):
    server = start_server(tiny_chat_model, "dp2", tmp_path,
                          extra_args=("--api-server-count", "2"))
    try:
        assert asyncio.run(_complete_all(server)) == _offline(llm)
        assert len(set(server.introspect()["engine_pids"])) == 2
    finally:
        assert server.stop() == 0, server.log_tail()
