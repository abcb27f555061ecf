"""loom/engine/child_process.py: a stop signal never cuts a child's start() in half, and a
child stops by itself once its parent has died, however it died."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from loom.engine.child_process import signal_on_parent_death, start_child


class _SignalledDuringStart:
    """Stands for a Process whose start() gets SIGTERM halfway through."""

    def __init__(self, handled: list[int]) -> None:
        self.handled = handled
        self.handled_during_start: list[int] | None = None

    def start(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # time for the handler to run, if it were not held back
        self.handled_during_start = list(self.handled)


def test_stop_signal_is_handled_once_start_returns():
    handled: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: handled.append(signum))
    try:
        process = _SignalledDuringStart(handled)
        start_child(process)
        assert process.handled_during_start == []
        assert handled == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sleep_watching_parent() -> None:
    signal_on_parent_death(signal.SIGKILL, "test grandchild")
    time.sleep(60)


def _start_grandchild_then_die(pid_out) -> None:
    grandchild = multiprocessing.get_context("spawn").Process(target=_sleep_watching_parent)
    grandchild.start()
    pid_out.send(grandchild.pid)
    time.sleep(1.0)  # let it start its watcher first, then die also before it: both must work
    os.kill(os.getpid(), signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_child_dies_with_its_killed_parent():
    ctx = multiprocessing.get_context("spawn")
    reader, writer = ctx.Pipe(duplex=False)
    parent = ctx.Process(target=_start_grandchild_then_die, args=(writer,))
    parent.start()
    assert reader.poll(60), "the parent did not start its child"
    grandchild = reader.recv()
    parent.join(30)
    assert parent.exitcode == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling another process's state
    alive = _alive(grandchild)
    if alive:
        os.kill(grandchild, signal.SIGKILL)
    assert not alive, "the child outlived its SIGKILLed parent"


def test_a_stop_that_comes_back_wrapped_still_stops_start_up_quietly(monkeypatch):
    """SIGTERM during start-up raises inside whatever runs, and Python may hand it back
    wrapped (a dataclass's __set_name__ makes it a RuntimeError mid-import): the engine core
    must still stop quietly, not report a start-up failure with its traceback."""
    import msgspec
    import pytest

    from loom.engine import core_proc
    from loom.engine.arg_utils import EngineArgs

    def importing(_config):
        try:
            core_proc._abort_startup(signal.SIGTERM, None)
        except BaseException as e:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance") from e
    reported = []
    monkeypatch.setattr("loom.engine.core.EngineCore", importing)
    monkeypatch.setattr(core_proc, "_report_failure", lambda *a: reported.append(a))
    monkeypatch.setattr(core_proc, "_aborting", False)
    config = EngineArgs(model="llama-3.1-8b", load_format="dummy").create_engine_config()
    with pytest.raises(core_proc._StartupAborted):
        core_proc._start(msgspec.json.encode(config), "", "", None, False, 0)
    assert reported == []
