"""`loom run-batch -i IN.jsonl -o OUT.jsonl --model MODEL ...`: vLLM's OpenAI batch runner.

Each input line is one request in OpenAI's batch file format,

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

and each output line, in the input's order, is its answer:

    {"id": "loom-...", "custom_id": "r1", "error": null,
     "response": {"status_code": 200, "request_id": "chatcmpl-...", "body": {...}}}

The API server's own routes answer the requests, in this process (an ASGI transport, no
socket), so a body is checked and answered exactly as `loom serve` would; a refused one
keeps its status code, with its OpenAI error body in `error` and `body` null. A line that
is no such request (not JSON, a field missing, a method other than POST, a URL outside
SUPPORTED_URLS, a streamed body, a custom_id an earlier line used) gets a 400 line of its
own, and every other line still runs. Up to 2 x max_num_seqs requests are in flight; each
result is written once those before it are, so an interrupted run keeps what finished.
-i and -o take local paths or http(s) URLs (read by GET before the model loads; written by
PUT after the run, from a file in --output-tmp-dir, which is kept if the upload fails).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, TextIO

import httpx

from loom.entrypoints.openai.errors import error_body

logger = logging.getLogger(__name__)

SUPPORTED_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/score",
                  "/score", "/v1/rerank", "/rerank", "/v2/rerank", "/classify", "/pooling")
UPLOAD_ATTEMPTS = 5
UPLOAD_RETRY_S = 2.0


def register(subparsers) -> None:
    from loom.engine.arg_utils import EngineArgs
    from loom.entrypoints.openai.cli import add_frontend_flags
    p = subparsers.add_parser(
        "run-batch", help="answer a file of OpenAI batch requests (JSONL) offline",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("batch")
    g.add_argument("-i", "--input-file", required=True,
                   help="the requests, one JSON object a line: a local path or an http(s) URL")
    g.add_argument("-o", "--output-file", required=True,
                   help="where the results go: a local path, or an http(s) URL to PUT them to")
    g.add_argument("--output-tmp-dir", default=None,
                   help="with a URL for --output-file, the directory of the file written "
                        "before the upload (default: the system's temporary directory)")
    g.add_argument("--enable-metrics", action="store_true",
                   help="serve the engine's Prometheus metrics at --url:--port/metrics "
                        "while the batch runs")
    g.add_argument("--url", default="0.0.0.0", help="the metrics server's address")
    g.add_argument("--port", type=int, default=8000, help="the metrics server's port")
    add_frontend_flags(p.add_argument_group("frontend (as `loom serve`'s)"))
    EngineArgs.add_cli_args(p)
    p.set_defaults(func=run_batch_command)


def run_batch_command(args: argparse.Namespace) -> int:
    from loom.entrypoints.openai.api_server import ServerOptions
    from loom.entrypoints.openai.cli import frontend_setup
    from loom.entrypoints.openai.launcher import run_with_engine
    if not 0 <= args.port < 65536:
        raise ValueError(f"port: must be 0-65535, got {args.port}")
    if args.output_tmp_dir is not None and not os.path.isdir(args.output_tmp_dir):
        raise ValueError(f"output_tmp_dir: {args.output_tmp_dir} is not a directory")
    config, frontend = frontend_setup(args, "api_server")
    options = ServerOptions(**frontend, access_log=False)
    with contextlib.ExitStack() as stack:
        source = stack.enter_context(_input_file(args.input_file))
        sink = stack.enter_context(_Output(args.output_file, args.output_tmp_dir))
        # Enough waiting to fill every step (the worker resolves an unset max_num_seqs by
        # device; 1024 is the most it picks), few enough to bound what is held.
        max_in_flight = 2 * (config.scheduler.max_num_seqs or 1024)

        async def main(make_client) -> int:
            return await _run(options, make_client, source, sink.file, max_in_flight,
                              (args.url, args.port) if args.enable_metrics else None)

        code = run_with_engine(config, options.log_stats, args.disable_frontend_multiprocessing,
                               main, "run-batch")
        if code == 0:
            return sink.publish()
        if _is_url(sink.path):
            logger.warning("results not uploaded; those written are in %s", sink.local)
        return code


async def _run(options, make_client, source: BinaryIO, out: TextIO, max_in_flight: int,
               metrics_at: tuple[str, int] | None) -> int:
    from loom.entrypoints.openai.api_server import build_app
    from loom.entrypoints.openai.server_state import build_state, close_state
    state, tracer = build_state(options, make_client,
                                lambda reason: logger.error("engine dead (%s)", reason))
    state.engine.start()
    try:
        if metrics_at is not None:
            _serve_metrics(state.metrics.registry, *metrics_at)
        counts = await run_batch(build_app(state), source, out, max_in_flight)
    finally:
        await close_state(state, tracer)
    logger.info("run-batch: %d requests in %.1f s: %d answered, %d refused or failed",
                counts.total, counts.seconds, counts.ok, counts.total - counts.ok)
    return 1 if state.engine.errored else 0


def _serve_metrics(registry, host: str, port: int) -> None:
    from prometheus_client import start_http_server
    try:
        start_http_server(port, host, registry=registry)
    except OSError as e:
        raise ValueError(f"port: cannot serve metrics at {host}:{port}: {e.strerror}") from None
    logger.info("metrics at http://%s:%d/metrics", host, port)


# -- the batch itself ------------------------------------------------------------------------

@dataclass
class BatchCounts:
    total: int = 0
    ok: int = 0
    seconds: float = 0.0


@dataclass
class _Request:
    custom_id: str
    url: str
    body: dict


async def run_batch(app, source: BinaryIO, out: TextIO, max_in_flight: int) -> BatchCounts:
    """Answer every request line of source through the ASGI app; write one result line each
    to out, in source's order."""
    from tqdm import tqdm
    counts, start = BatchCounts(), time.perf_counter()
    writer = _OrderedWriter(out)
    slots = asyncio.Semaphore(max_in_flight)
    tasks: set[asyncio.Task] = set()
    # A route that raises still answers 500 (its handler's), and the line says so.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    bar = tqdm(desc="Running batch", unit="req", mininterval=1.0)

    def done(index: int, record: dict) -> None:
        writer.put(index, record)
        counts.ok += record["error"] is None
        bar.update()

    async def answer(index: int, request: _Request) -> None:
        try:
            record = await _post(client, request)
        except Exception as e:  # noqa: BLE001 - its line must still be written, in order
            logger.exception("run-batch: request %r failed", request.custom_id)
            record = _result(request.custom_id, 500, error=json.loads(
                error_body(500, f"internal error: {type(e).__name__}: {e}")))
        finally:
            slots.release()
        done(index, record)

    async with httpx.AsyncClient(transport=transport, base_url="http://run-batch",
                                 timeout=None) as client:
        seen: set[str] = set()
        for index, (number, text) in enumerate(_lines(source)):
            counts.total += 1
            request = _parse(number, text, seen)
            if isinstance(request, dict):
                done(index, request)
                continue
            await slots.acquire()
            task = asyncio.create_task(answer(index, request))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        bar.total = counts.total
        bar.refresh()
        await asyncio.gather(*tasks)
    bar.close()
    counts.seconds = time.perf_counter() - start
    return counts


def _lines(source: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each non-blank line."""
    for number, line in enumerate(source, 1):
        if line.strip():
            yield number, line


def _parse(number: int, line: bytes, seen: set[str]) -> _Request | dict:
    """The request on one line, or the result line refusing it."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return _refused(None, f"line {number}: not UTF-8 ({e.reason} at byte {e.start})")
    try:
        item = json.loads(text)
    except ValueError as e:
        return _refused(None, f"line {number}: not JSON: {e}")
    if not isinstance(item, dict):
        return _refused(None, f"line {number}: must be a JSON object, got {text.strip()[:60]}")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _refused(None, f"custom_id: line {number} needs a non-empty string custom_id, "
                              f"got {custom_id!r}", "custom_id")
    if custom_id in seen:
        return _refused(custom_id, f"custom_id: {custom_id!r} (line {number}) is an earlier "
                                   "line's: each request needs its own", "custom_id")
    seen.add(custom_id)
    method, url, body = item.get("method"), item.get("url"), item.get("body")
    if method != "POST":
        return _refused(custom_id, f"method: only POST is supported, got {method!r}", "method")
    if url not in SUPPORTED_URLS:
        return _refused(custom_id, f"url: {url!r} is not supported; one of "
                                   f"{', '.join(SUPPORTED_URLS)}", "url")
    if not isinstance(body, dict):
        return _refused(custom_id, f"body: must be a JSON object, got {type(body).__name__}",
                        "body")
    if body.get("stream"):
        return _refused(custom_id, "stream: a batch request cannot stream; leave it unset or "
                                   "false", "stream")
    return _Request(custom_id, url, body)


async def _post(client: httpx.AsyncClient, request: _Request) -> dict:
    response = await client.post(request.url, json=request.body)
    try:
        answer = response.json()
    except ValueError:
        answer = json.loads(error_body(response.status_code, response.text[:500]))
    if response.status_code != 200:
        return _result(request.custom_id, response.status_code, error=answer)
    request_id = answer.get("id") if isinstance(answer, dict) else None
    return _result(request.custom_id, 200, body=answer, request_id=request_id)


def _refused(custom_id: str | None, message: str, param: str | None = None) -> dict:
    return _result(custom_id, 400, error=json.loads(error_body(400, message, param)))


def _result(custom_id: str | None, status: int, body=None, error=None,
            request_id: str | None = None) -> dict:
    """One output line, as vLLM writes it (OpenAI's batch output format)."""
    return {"id": f"loom-{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": status,
                         "request_id": request_id or f"loom-batch-{uuid.uuid4().hex}",
                         "body": body},
            "error": error}


class _OrderedWriter:
    """Writes results in their lines' order as soon as every earlier one is written."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.next = 0
        self.waiting: dict[int, dict] = {}

    def put(self, index: int, record: dict) -> None:
        self.waiting[index] = record
        if index != self.next:
            return
        while self.next in self.waiting:
            self.out.write(json.dumps(self.waiting.pop(self.next)) + "\n")
            self.next += 1
        self.out.flush()


# -- input and output files ------------------------------------------------------------------

def _is_url(path: str) -> bool:
    return path.startswith(("http://", "https://"))


@contextlib.contextmanager
def _input_file(path: str) -> Iterator[BinaryIO]:
    """The input, open for reading; a URL is fetched whole into a temporary file first."""
    if not _is_url(path):
        try:
            f = open(path, "rb")
        except OSError as e:
            raise ValueError(f"input_file: cannot read {path}: {e.strerror}") from None
        with f:
            yield f
        return
    with tempfile.TemporaryFile("w+b") as f:
        try:
            with httpx.stream("GET", path, follow_redirects=True, timeout=60) as response:
                response.raise_for_status()
                for chunk in response.iter_bytes():
                    f.write(chunk)
        except httpx.HTTPError as e:
            raise ValueError(f"input_file: cannot fetch {path}: {e}") from None
        f.seek(0)
        yield f


class _Output:
    """The output file, open for writing before the model loads (a bad path fails first);
    for a URL, a local file uploaded by publish()."""

    def __init__(self, path: str, tmp_dir: str | None) -> None:
        self.path = path
        self.local = path
        try:
            if _is_url(path):
                fd, self.local = tempfile.mkstemp(prefix="loom-batch-", suffix=".jsonl",
                                                  dir=tmp_dir)
                self.file = os.fdopen(fd, "w", encoding="utf-8")
            else:
                self.file = open(path, "w", encoding="utf-8")
        except OSError as e:
            raise ValueError(f"output_file: cannot write {self.local}: {e.strerror}") from None

    def __enter__(self) -> _Output:
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()

    def publish(self) -> int:
        """Upload a URL's results (0), or say where they were left (1)."""
        self.file.close()
        if not _is_url(self.path):
            logger.info("results written to %s", self.path)
            return 0
        for attempt in range(1, UPLOAD_ATTEMPTS + 1):
            try:
                with open(self.local, "rb") as f:
                    httpx.put(self.path, content=f, timeout=600).raise_for_status()
            except httpx.HTTPError as e:
                logger.warning("upload to %s failed (attempt %d of %d): %s", self.path,
                               attempt, UPLOAD_ATTEMPTS, e)
                if attempt < UPLOAD_ATTEMPTS:
                    time.sleep(UPLOAD_RETRY_S * attempt)
                continue
            os.unlink(self.local)
            logger.info("results uploaded to %s", self.path)
            return 0
        logger.error("results not uploaded; they are in %s", self.local)
        return 1
