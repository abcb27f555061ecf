"""Spawned children (engine core, TP workers, API servers) start cleanly and never outlive
their parent.

The parent's side, `start_child`: a stop signal (Ctrl-C, SIGTERM) that lands inside
`Process.start()` would cut the start-up data short, and the child would die at once with
an EOFError traceback from multiprocessing's spawn; so the parent holds its stop signals
back for those milliseconds and acts on them right after.

The child's side, `signal_on_parent_death`: an orphan would go on loading a model, and on
a GPU host go on holding its memory, with nobody left to stop it. So each child starts a
watcher thread first thing, which waits on multiprocessing's parent sentinel: a pipe whose
write end only the parent holds, so it turns readable once the parent has exited, however
it died (Ctrl-C, SIGTERM, SIGKILL, a crash). There is no start-up race: the pipe exists
before the child runs any of our code, so a parent that died even earlier is seen at once.

Why not Linux's prctl(PR_SET_PDEATHSIG)? It fires when the parent *thread* that spawned
the child exits, not the process: an `LLM` built in a short-lived thread would lose its
TP workers when that thread ended. The sentinel is per process and works off Linux too.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import signal
import threading

logger = logging.getLogger(__name__)

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def start_child(process: multiprocessing.process.BaseProcess, ignore_sigint: bool = False) -> None:
    """`process.start()`, with this process's stop signals held back until it returns.

    ignore_sigint: the child is born ignoring Ctrl-C (inherited through exec), so that a
    Ctrl-C during its imports, before it could set that itself, reaches only this process,
    which decides how the child stops. A Ctrl-C to this process within start() is lost."""
    if threading.current_thread() is not threading.main_thread():
        process.start()  # only the main thread runs (and may set) Python signal handlers
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: caught.append(signum))
                for sig in _STOP_SIGNALS if callable(signal.getsignal(sig))}
    if ignore_sigint:
        previous.setdefault(signal.SIGINT, signal.getsignal(signal.SIGINT))
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process.start()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in dict.fromkeys(caught):
            signal.raise_signal(sig)  # runs its handler now, which may raise


def signal_on_parent_death(sig: int, who: str) -> None:
    """Send `sig` to this process's main thread once the parent exits.

    SIGTERM lets a process with a handler stop in order (the engine core stops its
    workers); SIGKILL ends one with nothing to clean up (a worker) even mid-collective.
    A no-op when this process was not started by multiprocessing (nothing to watch)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    threading.Thread(target=_watch, args=(parent, sig, who), name="loom-parent-watch",
                     daemon=True).start()


def _watch(parent, sig: int, who: str) -> None:
    multiprocessing.connection.wait([parent.sentinel])
    logger.error("%s: its parent process %d exited; stopping", who, parent.pid)
    # The main thread exactly: a process-wide signal may land on another thread, and
    # Python runs signal handlers only on the main one.
    signal.pthread_kill(threading.main_thread().ident, sig)
