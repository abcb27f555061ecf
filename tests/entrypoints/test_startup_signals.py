"""Stopping `loom serve -tp 2` while it starts leaves no process behind.

Ctrl-C (SIGINT to the process group, as a terminal sends it) or SIGTERM to the launcher
(kill, docker stop) while the TP workers load: the launcher stops the engine core, the
core its workers, and the launcher exits 0 with one log line, no traceback. If a parent
is SIGKILLed instead, its children notice and stop by themselves (loom/engine/child_process.py).
Every wait here is bounded; leftovers are killed at the end so a failure pollutes nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.entrypoints.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 90.0  # until both TP workers exist, on a busy 2-core CPU
STOP_DEADLINE_S = 10.0  # until every process is gone; about 1 s when the machine is idle
FLAGS = ["-tp", "2", "--device", "cpu", "--enforce-eager", "--dtype", "float32",
         "--max-model-len", "128", "--kv-cache-memory-bytes", str(16 * 1024 * 1024)]
# A shell's `cmd &` or a test runner may start us with SIGINT ignored, which exec keeps;
# a terminal's Ctrl-C finds it at its default.
_WITH_DEFAULT_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                        "os.execv(sys.argv[1], sys.argv[1:])")


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        return [int(c) for t in tasks for c in open(f"/proc/{pid}/task/{t}/children").read().split()]
    except OSError:
        return []


def _identity(pid: int) -> str | None:
    """The start time (stat field 22) tells a process from a later one with its pid; None
    once it has exited (a zombie has exited too)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


class Tree:
    """`loom serve` and every process it started, remembered even once re-parented."""

    def __init__(self, proc: subprocess.Popen, log_path: Path) -> None:
        self.proc, self.log_path = proc, log_path
        self.seen: dict[int, str] = {}

    def scan(self) -> None:
        stack = [self.proc.pid]
        while stack:
            for child in _children(stack.pop()):
                if child not in self.seen and (ident := _identity(child)) is not None:
                    self.seen[child] = ident
                stack.append(child)

    def workers(self) -> list[int]:
        """Spawned grandchildren: the TP workers of the engine core."""
        core_children = [c for core in _children(self.proc.pid) for c in _children(core)]
        return [c for c in core_children if b"spawn_main" in _cmdline(c)]

    def engine_core(self) -> int:
        return next(c for c in _children(self.proc.pid) if _children(c))

    def alive(self) -> list[int]:
        self.proc.poll()
        return [p for p, ident in self.seen.items() if _identity(p) == ident] + \
            ([self.proc.pid] if self.proc.returncode is None else [])

    def wait_gone(self, deadline_s: float) -> list[int]:
        deadline = time.monotonic() + deadline_s
        while (left := self.alive()) and time.monotonic() < deadline:
            self.scan()
            time.sleep(0.05)  # polling other processes' state; nothing to wait on instead
        return left

    def kill_all(self) -> None:
        for pid in self.alive():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def _cmdline(pid: int) -> bytes:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError:
        return b""


def _start_until_workers(model: str, tmp_path: Path) -> Tree:
    log_path = tmp_path / "serve.log"
    cmd = [sys.executable, "-c", _WITH_DEFAULT_SIGINT, sys.executable, "-m", "loom.cli", "serve",
           model, "--port", str(free_port()), *FLAGS]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)  # its own group, as in a terminal
    tree = Tree(proc, log_path)
    deadline = time.monotonic() + START_DEADLINE_S
    while len(tree.workers()) < 2:
        if proc.poll() is not None or time.monotonic() > deadline:
            tree.kill_all()
            pytest.fail(f"the TP workers did not start (rc {proc.returncode}):\n{tree.log()}")
        time.sleep(0.05)  # polling another process's children
    tree.scan()
    assert "ready:" not in tree.log(), "the engine was ready before the test could stop it"
    return tree


@pytest.fixture
def model(tiny_model_factory) -> str:
    return tiny_model_factory("llama")[0]


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_stop_while_tp_workers_load(how, model, tmp_path):
    tree = _start_until_workers(model, tmp_path)
    try:
        if how == "ctrl-c":
            os.killpg(tree.proc.pid, signal.SIGINT)
        else:
            tree.proc.send_signal(signal.SIGTERM)
        left = tree.wait_gone(STOP_DEADLINE_S)
        log = tree.log()
        assert not left, f"still running {STOP_DEADLINE_S} s after {how}: {left}\n{log}"
        assert tree.proc.returncode == 0, log
        assert "Traceback" not in log, log
        name = "Ctrl-C" if how == "ctrl-c" else "SIGTERM"
        assert log.count(f"interrupted by {name}") == 1, log
    finally:
        tree.kill_all()


@pytest.mark.parametrize("victim", ["launcher", "engine core"])
def test_children_die_with_a_killed_parent(victim, model, tmp_path):
    """SIGKILL runs no handler: the engine core and the TP workers must see for
    themselves that their parent is gone."""
    tree = _start_until_workers(model, tmp_path)
    try:
        os.kill(tree.proc.pid if victim == "launcher" else tree.engine_core(), signal.SIGKILL)
        left = tree.wait_gone(STOP_DEADLINE_S)
        assert not left, f"still running {STOP_DEADLINE_S} s after killing the {victim}: " \
                         f"{left}\n{tree.log()}"
        assert tree.proc.returncode != 0
    finally:
        tree.kill_all()
