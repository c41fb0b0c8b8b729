"""What the local launcher and the pool both do with the processes they start on this machine.

Share out the cores and size each one's threads before it starts, make it follow its launcher
out, carry its reports (`PipeChannel` in it, `PipeReader` in the parent), stop it, and say how
it ended; LOOPBACK is the address they meet on.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import threading
import time
from dataclasses import dataclass

from dlscale.errors import one_line
from dlscale.launch.base import WORKER_EXIT_GRACE_S
from dlscale.launch.start import parent_alive, wait_for_parent_exit
from dlscale.signals import end_with_parent

LOOPBACK = "127.0.0.1"
# A worker that has exited, but whose report pipe another process still holds open (a data
# loader's worker it forked, until that sees its parent gone: torch checks every 5 s), is judged
# by its exit code after this long without its pipe's end.
PIPE_END_GRACE_S = 6.0


class PipeChannel:
    """A worker's reports on its own pipe (a sweep slot's, a launcher worker's): a worker killed
    mid-send can only garble its own channel, never another's, as a shared queue could (a
    multiprocessing Queue's write lock, held by a worker killed mid-put, blocks every other
    writer for good). The parent reads each pipe on a thread of its own (`PipeReader`), so a
    send waits only while the parent's process does not run, not while it prints or steps. The
    worker's heartbeat thread sends on it too, so every send holds the lock."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def put(self, item: tuple) -> None:
        self.send(("event", item))

    def send(self, message: tuple) -> None:
        with self.lock:
            self.conn.send(message)


@dataclass(frozen=True)
class PipeEnd:
    """A report pipe's last word from its `PipeReader`: every writer has closed it (the worker
    exited, or was killed, perhaps in the middle of a message)."""


@dataclass(frozen=True)
class Unreadable:
    """A message on a report pipe that did not unpickle (`why`); the reader reads on."""

    why: str


class PipeReader:
    """A worker's report pipe, read on a thread of its own into `arrived` as (key, message),
    then (key, PipeEnd()) once.

    The launcher (or pool) never waits in a receive itself: a worker stopped (SIGSTOP) in the
    middle of a message holds only its own reader, and a worker never waits on a full pipe
    while its launcher prints. The thread closes the pipe at its end: closed from another
    thread while this one reads, the descriptor's number could be reused under the read. A
    message cut short by its writer's death reads as the pipe's end (the exit code tells the
    rest); one whose bytes do not unpickle arrives as `Unreadable` and the next is read as
    usual (each message comes whole, its length first, before it is unpickled)."""

    def __init__(self, conn, key, arrived: queue.Queue):
        self.conn, self.key, self.arrived = conn, key, arrived
        self.thread = threading.Thread(target=self._read, daemon=True, name=f"dlscale-read-{key}")
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                data = self.conn.recv_bytes()
                try:
                    message = pickle.loads(data)
                except Exception as exc:  # bytes that are no message: any unpickling error
                    message = Unreadable(f"{type(exc).__name__}: {one_line(exc)}")
                self.arrived.put((self.key, message))
        except (EOFError, OSError):  # every writer gone, perhaps mid-message
            pass
        finally:
            try:
                self.conn.close()
            finally:
                self.arrived.put((self.key, PipeEnd()))

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)


class ExitWatch:
    """When a process's exit may be acted on: once all it reported has been read (its pipe's end
    taken in), or PIPE_END_GRACE_S after it exited if another process holds its pipe open (a
    data loader's worker it forked). The launcher (`_Reported`) and the pool (`_exited`) both
    judge a worker's exit so."""

    def __init__(self, process):
        self.process = process
        self.exited: float | None = None  # when first seen exited with reports still to come

    def code(self, reports_in: bool) -> int | None:
        code = self.process.exitcode
        if code is None or reports_in:
            return code
        if self.exited is None:
            self.exited = time.monotonic()
        return code if time.monotonic() - self.exited > PIPE_END_GRACE_S else None


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, or DLSCALE_CPUS when a pool task set it
    (a trial given 2 cores of a Ray node sizes its own workers to those 2, not to the node)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    share = os.environ.get("DLSCALE_CPUS")
    return max(1, min(cores or 1, int(share)) if share else (cores or 1))


def die_with_parent(parent_pid: int) -> None:
    """A worker must not outlive its launcher: ask the kernel, and watch as a fallback."""
    end_with_parent()
    # Forked from the fork server, the kernel's parent is that server, which exits with the
    # launcher (and then PR_SET_PDEATHSIG ends this process); the watch asks about the launcher.
    if not parent_alive(parent_pid):
        os._exit(1)

    def watch() -> None:
        wait_for_parent_exit(parent_pid)  # returns the moment the launcher is gone
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="dlscale-parent-watch").start()


@contextlib.contextmanager
def thread_env(threads: int):
    """Children inherit the environment at spawn: size OpenMP's pool before torch loads there.

    Unpickling a worker's function imports torch before any of our code runs in the child, and
    an OpenMP pool sized for every core then competes with the other workers for the cores.
    """
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, str(threads)))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def describe_exit(code: int | None) -> str:
    if code is None:  # still not reaped after SIGKILL (a driver's teardown, say)
        return "did not end when killed"
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (out of memory, or killed)" if name == "SIGKILL" else ""
        return f"was killed by {name}{hint}"
    return f"exited with code {code}"


def stop_processes(processes) -> None:
    """SIGTERM the live ones, give them a moment, SIGKILL what is left, and reap all (a
    process never started, its start cut short by a stop, is left out)."""
    processes = [process for process in processes if process.pid is not None]
    for process in processes:
        if process.is_alive():
            process.terminate()
            # A stopped process (SIGSTOP) acts on SIGTERM only once continued; else it would
            # hold the job for the whole grace until SIGKILL.
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
    deadline = time.monotonic() + WORKER_EXIT_GRACE_S
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join(timeout=WORKER_EXIT_GRACE_S)
