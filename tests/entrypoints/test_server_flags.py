"""`loom serve` with vLLM's --generation-config vllm, --max-logprobs, --enable-log-requests,
--enable-log-outputs, --max-log-len and --uvicorn-log-level, in one served process (the
engine core its own); and
with TLS (--ssl-keyfile/--ssl-certfile), spoken to by the official openai client."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import subprocess

import httpx
import pytest

from tests.entrypoints.conftest import API_KEY, start_server

FLAGS = ("--generation-config", "vllm", "--max-logprobs", "2", "--enable-log-requests",
         "--max-log-len", "8", "--uvicorn-log-level", "warning", "--enable-log-outputs")
PROMPT = "Once upon a time, in a land far away"
CHAT = {"messages": [{"role": "user", "content": "a"}]}
GENERATED = re.compile(r"Generated response (cmpl-\S+) \(completion 0\): output: (.*), "
                       r"output_token_ids: \[(.*)\], finish_reason: length$")
RECEIVED = re.compile(r"Received request (cmpl-\S+): prompt: (.*), params: SamplingParams\(.*\), "
                      r"prompt_token_ids: \[(.*)\]$")


def test_served_flags(tiny_chat_model, tmp_path):
    path = tmp_path / "model"
    shutil.copytree(tiny_chat_model, path)
    # What "vllm" must ignore: greedy decoding, were it the default.
    (path / "generation_config.json").write_text(json.dumps({"temperature": 0.0}))
    server = start_server(str(path), "mp", tmp_path, extra_args=FLAGS)
    try:
        with httpx.Client(base_url=server.url, timeout=60,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            texts_all = [http.post("/v1/completions", json={
                "prompt": PROMPT, "max_tokens": 6, "seed": seed, "ignore_eos": True,
            }).json()["choices"][0]["text"] for seed in (1, 2, 3)]
            texts = set(texts_all)
            too_many = http.post("/v1/completions", json={"prompt": "a", "logprobs": 3})
            chat_too_many = http.post("/v1/chat/completions", json={
                **CHAT, "logprobs": True, "top_logprobs": 3})
            # Refused by the Processor's checks, past the endpoints' own.
            prompt_too_many = [http.post(path, json={**body, "prompt_logprobs": 3})
                               for path, body in (("/v1/completions", {"prompt": "a"}),
                                                  ("/v1/chat/completions", CHAT))]
            allowed = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 1,
                                                         "logprobs": 2})
    finally:
        assert server.stop() == 0
    assert len(texts) > 1, texts  # sampled at temperature 1, not the file's 0
    for response, field in ((too_many, "logprobs"), (chat_too_many, "top_logprobs"),
                            *((r, "prompt_logprobs") for r in prompt_too_many)):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and "max_logprobs (2)" in error["message"], error
    assert allowed.status_code == 200, allowed.text
    allowed_text = allowed.json()["choices"][0]["text"]
    log = server.log_path.read_text()
    received = [RECEIVED.search(line) for line in log.splitlines() if "Received request" in line]
    # One line per completion that reached the engine (the four refused never did), as vLLM
    # logs a request once it is accepted for generation; chat and completions alike.
    assert len(received) == 4 and all(received), log
    prompt, ids = ast.literal_eval(received[0].group(2)), received[0].group(3).split(", ")
    assert prompt == PROMPT[:8] and len(ids) == 8, received[0].group(0)
    assert "Started server process" not in log  # uvicorn at warning
    # --enable-log-outputs: each finished completion's text and ids, cut to --max-log-len
    generated = [GENERATED.search(line) for line in log.splitlines()
                 if "Generated response" in line]
    assert len(generated) == 4 and all(generated), log
    said = [ast.literal_eval(g.group(2)) for g in generated]
    assert sorted(said) == sorted([t[:8] for t in texts_all] + [allowed_text[:8]]), said
    assert sorted(len(g.group(3).split(", ")) for g in generated) == [1, 6, 6, 6]
    assert {g.group(1) for g in generated} == {r.group(1) for r in received}


def test_tls(tiny_chat_model, tmp_path, capsys):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    from tests.test_cli import _main_error
    assert "ssl_certfile: --ssl-keyfile needs --ssl-certfile" in _main_error(
        capsys, "serve", "--ssl-keyfile", str(key))
    assert "ssl_certfile: cannot load the TLS files" in _main_error(
        capsys, "serve", "--ssl-keyfile", str(cert), "--ssl-certfile", str(cert))
    server = start_server(tiny_chat_model, "mp", tmp_path, extra_args=(
        "--ssl-keyfile", str(key), "--ssl-certfile", str(cert)))
    try:
        assert server.url.startswith("https://")
        client = server.client(http_client=httpx.Client(verify=server.verify))
        completion = client.completions.create(model=client.models.list().data[0].id,
                                               prompt="Hi", max_tokens=2)
        assert completion.usage.completion_tokens == 2
        with pytest.raises(httpx.HTTPError):  # the port speaks TLS only
            httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=5)
    finally:
        assert server.stop() == 0
    assert f"at https://127.0.0.1:{server.port}" in server.log_path.read_text()


def test_uds(tiny_chat_model, tmp_path, capsys, llm):
    """--uds (vLLM's): served on a Unix domain socket, the same answers as offline; a stale
    socket file is replaced, any other file refused; the socket goes with the server."""
    from loom import SamplingParams
    from tests.test_cli import _main_error
    taken = tmp_path / "taken"
    taken.write_text("not a socket")
    assert "uds: " + str(taken) + " exists and is not a socket" in _main_error(
        capsys, "serve", "llama-3.1-8b", "--load-format", "dummy", "--device", "cpu",
        "--uds", str(taken))
    path = str(tmp_path / "loom.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)  # an earlier server's, left behind
    stale.close()
    server = start_server(tiny_chat_model, "mp", tmp_path, extra_args=("--uds", path))
    try:
        with server.http(timeout=60, headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            got = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5,
                                                     "temperature": 0, "ignore_eos": True})
        with pytest.raises(httpx.HTTPError):  # nothing on the TCP port
            httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=2)
    finally:
        assert server.stop() == 0
    want = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0].text
    assert got.json()["choices"][0]["text"] == want
    assert f"at unix:{path}" in server.log_path.read_text()
    assert not os.path.exists(path)
