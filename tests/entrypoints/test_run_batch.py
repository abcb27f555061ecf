"""`loom run-batch` (vLLM's OpenAI batch runner) on the tiny chat Llama: answers equal
transformers' greedy tokens and parse as the official openai client's types; every kind of
bad line gets its own 400 line while the rest run; URLs in and out; bad flags are one line."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading

import pytest

from loom.cli import main

FLAGS = ["--dtype", "float32", "--device", "cpu", "--max-model-len", "1024",
         "--kv-cache-memory-bytes", str(32 * 1024 * 1024)]
CHAT = [{"role": "user", "content": "Name three colours."}]
PROMPT = "The capital of France is"


def _line(custom_id, url="/v1/chat/completions", body=None, method="POST") -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


def _chat(**extra) -> dict:
    return {"messages": CHAT, "max_tokens": 8, "temperature": 0, **extra}


LINES = [
    _line("chat", body=_chat()),
    _line("completion", "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0}),
    "",  # blank lines are skipped
    "{not json",
    _line("bad-max-tokens", body=_chat(max_tokens=-1)),
    _line("files", "/v1/files", {}),
    _line("get", body=_chat(), method="GET"),
    _line("stream", body=_chat(stream=True)),
    _line("chat", body=_chat()),  # a custom_id used before
    _line("embed", "/v1/embeddings", {"input": "hello"}),
    json.dumps({"method": "POST", "url": "/v1/chat/completions", "body": _chat()}),
    _line("chat-n2", body=_chat(n=2, temperature=1.0, seed=3)),
]


NOT_UTF8 = b'{"custom_id": "\xff"}\n'


def _greedy(path: str, ids: list[int], n: int = 8) -> str:
    import torch
    import transformers as tf
    tokenizer = tf.AutoTokenizer.from_pretrained(path)
    model = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)
    return tokenizer.decode(out[0, len(ids):], skip_special_tokens=True)


@pytest.fixture(scope="module")
def batch(tiny_chat_model, tmp_path_factory):
    where = tmp_path_factory.mktemp("run-batch")
    (where / "in.jsonl").write_bytes(("\n".join(LINES) + "\n").encode() + NOT_UTF8)
    rc = main(["run-batch", "-i", str(where / "in.jsonl"), "-o", str(where / "out.jsonl"),
               "--model", tiny_chat_model, "--disable-frontend-multiprocessing", *FLAGS])
    results = [json.loads(line) for line in (where / "out.jsonl").read_text().splitlines()]
    return rc, results


def test_answers_equal_transformers_and_parse_as_openai_types(batch, tiny_chat_model):
    import transformers as tf
    from openai.types import Completion, CreateEmbeddingResponse
    from openai.types.chat import ChatCompletion
    rc, results = batch
    assert rc == 0
    assert len(results) == len(LINES)  # one line each, in order, the blank one skipped
    chat, completion = results[0], results[1]
    assert chat["custom_id"] == "chat" and chat["error"] is None
    assert chat["response"]["status_code"] == 200
    body = ChatCompletion.model_validate(chat["response"]["body"])
    assert chat["response"]["request_id"] == body.id
    tokenizer = tf.AutoTokenizer.from_pretrained(tiny_chat_model)
    text = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert body.choices[0].message.content == _greedy(tiny_chat_model, ids)
    text = Completion.model_validate(completion["response"]["body"]).choices[0].text
    assert text == _greedy(tiny_chat_model, tokenizer(PROMPT)["input_ids"])
    embedding = CreateEmbeddingResponse.model_validate(results[8]["response"]["body"])
    assert results[8]["custom_id"] == "embed" and len(embedding.data[0].embedding) == 64
    n2 = ChatCompletion.model_validate(results[-2]["response"]["body"])
    assert results[-2]["custom_id"] == "chat-n2" and len(n2.choices) == 2
    assert len({r["id"] for r in results}) == len(results)


def test_each_bad_line_is_refused_on_its_own(batch):
    _, results = batch
    refused = dict(enumerate(results))
    expect = {  # index: (custom_id, status, what the message says)
        2: (None, 400, "line 4: not JSON"),
        3: ("bad-max-tokens", 400, "max_tokens"),
        4: ("files", 400, "url: '/v1/files' is not supported"),
        5: ("get", 400, "method: only POST"),
        6: ("stream", 400, "cannot stream"),
        7: ("chat", 400, "'chat' (line 9) is an earlier line's"),
        9: (None, 400, "custom_id: line 11 needs"),
        11: (None, 400, "line 13: not UTF-8"),
    }
    for i, (custom_id, status, says) in expect.items():
        record = refused[i]
        assert record["custom_id"] == custom_id, record
        assert record["response"]["status_code"] == status, record
        assert record["response"]["body"] is None
        error = record["error"]["error"]  # OpenAI's error body
        assert says in error["message"], record
        assert error["code"] == status and error["type"]


class _Files(http.server.BaseHTTPRequestHandler):
    """GET serves, PUT stores, files held in the class (the batch's input and output URLs)."""
    files: dict[str, bytes] = {}

    def do_GET(self):
        data = self.files.get(self.path)
        self.send_response(200 if data is not None else 404)
        self.end_headers()
        self.wfile.write(data or b"")

    def do_PUT(self):
        length = int(self.headers.get("Content-Length", 0))
        self.files[self.path] = self.rfile.read(length)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_urls_in_and_out_with_the_engine_in_its_own_process(batch, tiny_chat_model, tmp_path):
    """The default (engine core process) reading and writing over HTTP, its metrics served;
    its answers are the in-process run's (greedy)."""
    from tests.entrypoints.conftest import free_port
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    _Files.files["/in.jsonl"] = ("\n".join(LINES[:2]) + "\n").encode()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "loom.cli", "run-batch", "-i", f"{base}/in.jsonl",
             "-o", f"{base}/out.jsonl", "--output-tmp-dir", str(tmp_path),
             "--enable-metrics", "--url", "127.0.0.1", "--port", str(free_port()),
             "--model", tiny_chat_model, *FLAGS],
            capture_output=True, text=True, timeout=300, env={**os.environ})
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in _Files.files["/out.jsonl"].decode().splitlines()]
    assert [r["custom_id"] for r in results] == ["chat", "completion"]
    for got, want in zip(results, batch[1][:2]):
        assert got["response"]["body"]["choices"] == want["response"]["body"]["choices"]
    assert os.listdir(tmp_path) == []  # the local copy is gone once uploaded
    assert "metrics at http://127.0.0.1:" in proc.stderr


@pytest.mark.parametrize("flags, says", [
    (["-i", "/nonexistent/in.jsonl", "-o", "{tmp}/out.jsonl"], "input_file: cannot read"),
    (["-i", "{tmp}/in.jsonl", "-o", "/nonexistent/out.jsonl"], "output_file: cannot write"),
    (["-i", "http://127.0.0.1:9/in.jsonl", "-o", "{tmp}/out.jsonl"], "input_file: cannot fetch"),
    (["-i", "{tmp}/in.jsonl", "-o", "http://127.0.0.1:9/o", "--output-tmp-dir", "/nonexistent"],
     "output_tmp_dir: /nonexistent is not a directory"),
    (["-i", "{tmp}/in.jsonl", "-o", "{tmp}/out.jsonl", "--port", "70000"], "port: must be"),
])
def test_bad_flags_are_one_line_before_the_model_loads(flags, says, tiny_chat_model, tmp_path,
                                                       capsys):
    (tmp_path / "in.jsonl").write_text(LINES[0] + "\n")
    argv = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    assert main(["run-batch", *argv, "--model", tiny_chat_model, *FLAGS]) == 2
    err = capsys.readouterr().err
    assert "loom run-batch: error: " in err and says in err, err


def test_lines_stay_in_order_and_a_route_that_raises_gets_its_own(tmp_path):
    """run_batch over a bare app: a slow first answer holds the later ones back until it is
    written; a route that raises answers 500 on its own line."""
    import asyncio
    import io

    from fastapi import FastAPI

    from loom.entrypoints.openai.run_batch import run_batch
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(body: dict) -> dict:
        if body["prompt"] == "boom":
            raise RuntimeError("boom")
        await asyncio.sleep(0.2 if body["prompt"] == "slow" else 0)
        return {"id": body["prompt"]}

    lines = [_line(p, "/v1/completions", {"prompt": p}) for p in ("slow", "boom", "fast")]
    out = io.StringIO()
    counts = asyncio.run(run_batch(app, io.BytesIO("\n".join(lines).encode()), out, 4))
    results = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["custom_id"] for r in results] == ["slow", "boom", "fast"]
    assert [r["response"]["status_code"] for r in results] == [200, 500, 200]
    assert results[0]["response"]["request_id"] == "slow" and results[1]["error"]["error"]
    assert (counts.total, counts.ok) == (3, 2)
