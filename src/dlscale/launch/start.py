"""How local worker processes start: forked from a server that has already imported torch.

A spawned worker imports torch, scikit-learn and dlscale before its first step: about 3 s of one
core each on the 2-core development machine, paid by every worker of every run. Python's
`forkserver` start method pays it once: a server process imports them, and each worker is a
fork of it. A fork of a process that never ran a torch op is safe (no thread pools exist yet),
and the server itself never runs one.

Forked from the server, a worker inherits the server's environment and has the server as its
parent, not the launcher; `adopt()` gives it the launcher's environment as it was at start (as a
spawned process would have it) and `parent_alive()` watches the launcher itself.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import time

# What every worker needs before its first step; a module that fails to import is skipped.
PRELOAD = [
    "torch",
    "sklearn.model_selection",
    "sklearn.datasets",
    "dlscale.train.loop",
    "dlscale.strategies.worker",
    # Every trainer's first optimizer step imports it (torch wraps optimizer methods with
    # torch._disable_dynamo): about 1.5 s of one core a worker, paid once here instead.
    "torch._dynamo",
    # The server's own exit then skips a second of garbage collection (see that module).
    "dlscale.launch.quick_exit",
]
_configured = False


def context():
    """The multiprocessing context local workers and pool tasks start from."""
    global _configured
    if os.environ.get("DLSCALE_START", "forkserver") == "spawn":  # the slower, plainer way
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    if not _configured:
        ctx.set_forkserver_preload(["dlscale.launch.server_preload"])  # PRELOAD, Ctrl-C ignored
        _configured = True
    return ctx


def import_quietly(names: list[str]) -> None:
    """Import these modules (one that fails to import is skipped) with SIGINT ignored, then put
    back the handler that was in place. The fork server does so (launch/server_preload.py): it
    runs in the terminal's process group, and Ctrl-C in the seconds its imports take printed
    the interrupted import's traceback (found by trying it); the launcher stops its workers."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for name in names:
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if before is None else before)


def environment() -> dict[str, str]:
    """The launcher's environment now: what a spawned worker would start with."""
    return dict(os.environ)


def adopt(environment: dict[str, str]) -> None:
    """In the worker: take the launcher's environment instead of the fork server's."""
    os.environ.clear()
    os.environ.update(environment)


def parent_alive(parent_pid: int) -> bool:
    """Whether the launcher that started this worker still runs (it is not the OS parent when
    the worker was forked from the server)."""
    parent = mp.parent_process()
    if parent is not None and parent.pid == parent_pid:
        return parent.is_alive()
    return os.getppid() == parent_pid


def wait_for_parent_exit(parent_pid: int) -> None:
    """Block until the launcher is gone: at once, on its end of the pipe closing, when it
    started this process; otherwise by asking the kernel twice a second."""
    parent = mp.parent_process()
    if parent is not None and parent.pid == parent_pid:
        multiprocessing.connection.wait([parent.sentinel])
        return
    while os.getppid() == parent_pid:
        time.sleep(0.5)


def warm_up() -> None:
    """Start the fork server now, if workers will fork from it: it imports torch and the rest
    in its own process while this one goes on (the checks before a launch take seconds)."""
    ctx = context()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def _nothing() -> None:
    """A process that does nothing: forked once, it proves the server ready."""


def warmed_up() -> None:
    """Start the fork server and wait until it has imported everything: one process forked from
    it and ended. For timings run one after another (`compare`): the first run's wall time
    otherwise carries the server's imports, seconds the runs after it do not pay."""
    ctx = context()
    if ctx.get_start_method() != "forkserver":
        return
    process = ctx.Process(target=_nothing, daemon=True)
    process.start()
    process.join()
