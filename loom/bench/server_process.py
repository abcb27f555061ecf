"""Start a `loom serve` subprocess for a benchmark and make sure it goes away again.

The server runs in its own session (process group), so that stopping it reaches the engine
core and worker processes it started too: SIGINT first (a clean shutdown), SIGKILL to the
group if it has not exited within the stop timeout. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

_LOOM_ROOT = Path(__file__).resolve().parents[2]
_POLL_S = 0.5


@dataclass(frozen=True)
class ServerSpec:
    model: str
    tokenizer: str | None
    host: str = "127.0.0.1"
    port: int = 0
    """0: a free port chosen at start."""
    inproc: bool = False
    """--disable-frontend-multiprocessing."""
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    start_timeout_s: float = 900.0
    stop_timeout_s: float = 30.0

    def command(self, port: int) -> list[str]:
        cmd = [sys.executable, "-m", "loom.cli", "serve", "--model", self.model,
               "--host", self.host, "--port", str(port)]
        if self.tokenizer:
            cmd += ["--tokenizer", self.tokenizer]
        if self.inproc:
            cmd.append("--disable-frontend-multiprocessing")
        return cmd + list(self.extra_args)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(proc: subprocess.Popen, base_url: str, log_path: Path, timeout_s: float) -> None:
    """Poll /health until it answers 200; fail at once if the server exits, or at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"loom serve exited with {proc.returncode} before it was healthy; "
                               f"log {log_path}:\n{_log_tail(log_path)}")
        if _healthy(base_url + "/health"):
            return
        time.sleep(_POLL_S)  # polling another process; nothing here to wait on instead
    raise RuntimeError(f"loom serve was not healthy after {timeout_s:.0f} s; log {log_path}:\n"
                       f"{_log_tail(log_path)}")


def stop(proc: subprocess.Popen, timeout_s: float) -> None:
    """SIGINT to the server's process group, SIGKILL after `timeout_s`; always reaps it."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGINT, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
            break
        except subprocess.TimeoutExpired:
            continue
    # The leader has exited; children it left behind in its group go too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def running_server(spec: ServerSpec, log_path: Path) -> Iterator[str]:
    """Start `loom serve`, yield its base URL once /health answers, stop it on the way out."""
    port = spec.port or free_port(spec.host)
    base_url = f"http://{spec.host}:{port}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_LOOM_ROOT), env.get("PYTHONPATH")]))
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(spec.command(port)) + "\n")
        log.flush()
        proc = subprocess.Popen(spec.command(port), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        try:
            wait_healthy(proc, base_url, log_path, spec.start_timeout_s)
            yield base_url
        finally:
            stop(proc, spec.stop_timeout_s)

