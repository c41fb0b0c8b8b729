"""How a dlscale process stops: SIGTERM as Ctrl-C does (an exception that unwinds the run), and
with the process that started it. Every layer uses it, as it uses errors.py.

`kill PID`, systemd, Slurm, Docker and `timeout` all send SIGTERM before they SIGKILL. Its default
action ends the process on the spot: a checkpoint it was writing stays behind as a `.tmp` file,
its workers are orphaned for a moment, and the shell only says 143. Raised as `Terminated` (a
KeyboardInterrupt), the stop takes Ctrl-C's path instead: an atomic write under way is discarded
(atomic.py), the run folder's lock goes, the launcher stops its workers, and the command
says how to resume.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from typing import NoReturn


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process stood; the command's exit code is the shell's 143."""

    exit_code = 128 + signal.SIGTERM


def say_on_stop(stop: KeyboardInterrupt, hint: str) -> None:
    """What the command says after `interrupted` (or `terminated`) in place of its own hint: a
    run stopped before its first checkpoint has nothing for --resume to continue."""
    stop.hint = hint


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises Terminated in this process's main thread, once: a second one
    while the first unwinds is ignored, so it cannot cut the cleanup short (SIGKILL still ends
    the process). The `dlscale` command and every local worker and sweep slot set it."""
    _unless_ignored(signal.SIGTERM, _terminated)


def stop_once() -> None:
    """In a worker: the first SIGINT or SIGTERM raises (KeyboardInterrupt, Terminated), and both
    are ignored from then on. Ctrl-C at a terminal reaches every process of the group, and the
    launcher then SIGTERMs its workers to be sure: that second signal would otherwise land in
    the middle of the first one's cleanup (a half-written file being removed)."""
    _unless_ignored(signal.SIGINT, _interrupted_once)
    _unless_ignored(signal.SIGTERM, _interrupted_once)


def ignore(*signums: int) -> None:
    """Ignore these signals from now on, one already on its way included.

    Set to SIG_IGN from inside a handler, a signal that arrived just before is still handled by
    CPython, which then finds SIG_IGN and prints OSError("Signal 15 ignored due to race
    condition") as a traceback in the middle of the cleanup (found by pressing Ctrl-C on a ddp
    run: each worker took the terminal's SIGINT and the launcher's SIGTERM together). A handler
    that does nothing takes it instead, and the system calls it interrupts are restarted. Only
    the handlers below need it: outside a handler, `signal.signal` runs a pending handler first,
    and SIG_IGN (kept through exec and Python's shutdown) is the better choice there."""
    for signum in signums:
        signal.signal(signum, _swallow)
        signal.siginterrupt(signum, False)


def _swallow(signum, frame) -> None:
    """A signal `ignore` ignores."""


def _unless_ignored(signum: int, handler) -> None:
    """A signal this process was started with ignored stays ignored: `dlscale train ... &` from a
    script ignores SIGINT, and so do sweep slots on purpose; a worker that took Ctrl-C anyway
    would die of it while its parent carries on and blames it."""
    if signal.getsignal(signum) not in (signal.SIG_IGN, _swallow):
        signal.signal(signum, handler)


def _terminated(signum, frame) -> None:
    ignore(signal.SIGTERM)
    raise Terminated


def _interrupted_once(signum, frame) -> None:
    ignore(signal.SIGINT, signal.SIGTERM)
    raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def end_by_signal(stop: KeyboardInterrupt) -> NoReturn:
    """End this process by the signal that stopped it, once its run has unwound: its parent
    reads the exit as 'killed by SIGTERM' (or SIGINT), as it did before the unwinding."""
    signum = signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached: the signal's default action ends the process


def end_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; elsewhere nothing):
    a worker, or a data loader's worker, must not outlive the process that started it."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def interrupt_behind(exc: BaseException) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (or Terminated) `exc` is, or replaced: a stop that lands in
    torch's C++ code while it calls back into Python (a torch.save write) comes back as its own
    RuntimeError ('unexpected pos ...'), and must still end the run as interrupted."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__context__
    return None
