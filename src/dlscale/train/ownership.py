"""Output folders are owned by one process: checked up front, then locked for the run's life.

Two runs into one folder would replace each other's run.json and checkpoints without a word;
the second is refused instead. The lock is an flock on a file in the folder: the kernel drops it
when the holder exits, however it exits (SIGKILL included), so a crash never leaves it stuck.
Spawned workers do not inherit it (Python opens files non-inheritable), and need not: they
live no longer than the process that holds it.

A folder inside a held one is refused too (`--out` under a live run's folder, where its
checkpoints and run.json are written and pruned), except where the holder of the outer folder
is the one asking: `compare` and `scale` train their runs inside the folder they hold, and a
sweep's trials (other processes) each hold their own folder inside the sweep's.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from dlscale.errors import UserError, os_reason
from dlscale.train.run_folder import DEFAULT_RUNS_DIR, check_folder, folder_problem, new_run_dir

LOCK_NAME = ".dlscale.lock"
# Another process may hold a folder's lock for a moment without running there: one that looks
# whether the folder is in use (_holder_of, for a folder nested inside it). Taking the lock is
# tried this often, this far apart, before the folder counts as in use.
LOCK_TRIES = 5
_held_here: set[Path] = set()  # folders this process holds: its own runs nest inside them
LOCK_RETRY_S = 0.02


def claim_token(folder: Path) -> str | None:
    """What names this claim of `folder` and no other: its path and its lock file's identity
    (made afresh by every claim). The processes of one run agree on it while the run holds the
    folder; a rerun or a resume gets another. None where the folder is not held (its lock is on
    another host's disk, or gone)."""
    try:
        lock = os.stat(Path(folder) / LOCK_NAME)
    except OSError:
        return None
    return f"{os.path.realpath(folder)}#{lock.st_ino}:{lock.st_ctime_ns}"


def claim(folder: Path, within: Path | None = None) -> contextlib.AbstractContextManager[Path]:
    """Hold `folder` for as long as the block runs: made if missing, refused in one line if it
    cannot be a folder, or another process holds it or a folder it is inside. `within`: a folder
    above it that the caller's own job holds (a sweep's, for a trial), not checked. On leaving,
    the lock file goes, and so does the folder if it was made here and nothing was written
    into it (a run refused before it started leaves no empty folder behind)."""
    folder = Path(folder)
    return _held(folder, made=check_folder(folder), within=within)


def claim_new(name: str, root: Path = DEFAULT_RUNS_DIR) -> contextlib.AbstractContextManager[Path]:
    """Hold a new runs/<name>-<timestamp> folder: made here, so two runs that start in the same
    second never pick the same one."""
    while True:
        folder = new_run_dir(name, root)
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            continue  # another run took this name a moment ago: new_run_dir picks the next
        except OSError as exc:
            raise UserError(folder_problem(folder, exc)) from None
        return _held(folder, made=True)


@contextlib.contextmanager
def _held(folder: Path, made: bool, within: Path | None = None) -> Iterator[Path]:
    fd = _lock(folder)
    key = folder.resolve()
    try:
        _refuse_inside_held(folder, within)
        _held_here.add(key)
        yield folder
    finally:
        _held_here.discard(key)
        with contextlib.suppress(OSError):  # while still held: no one can have it half-removed
            (folder / LOCK_NAME).unlink()
            if made:
                folder.rmdir()  # only if empty
        os.close(fd)


def _lock(folder: Path) -> int:
    """Take the folder's lock without waiting; its file names the holder (pid, host)."""
    path = folder / LOCK_NAME
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise UserError(folder_problem(folder, exc)) from None
        try:
            _flock_soon(fd)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise UserError(
                f"{folder} is in use by another dlscale run{holder}: wait for it to end, "
                "or choose another --out"
            ) from None
        # The holder before us may have removed the file between our open and our lock: a
        # lock on a file no longer in the folder guards nothing, so take the new one.
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    except OSError as exc:  # a full disk: better said now than at the first checkpoint
        os.close(fd)
        raise UserError(f"cannot write in {folder}: {os_reason(exc)}") from None
    return fd


def _holder(fd: int) -> str:
    """' (pid 123)', or ' (pid 123 on host)' when it runs on another machine of a shared
    file system; empty when the holder has not written it yet."""
    words = os.pread(fd, 200, 0).decode(errors="replace").split()
    if not words:
        return ""
    on = f" on {words[1]}" if len(words) > 1 and words[1] != socket.gethostname() else ""
    return f" (pid {words[0]}{on})"


def _flock_soon(fd: int) -> None:
    """The exclusive lock, tried LOCK_TRIES times: BlockingIOError if it stays held."""
    for attempt in range(LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if attempt == LOCK_TRIES - 1:
                raise
            time.sleep(LOCK_RETRY_S)


def _refuse_inside_held(folder: Path, within: Path | None) -> None:
    """One line if a folder above `folder` (below `within`, if given) is held by a live run."""
    stop = Path(within).resolve() if within is not None else None
    for outer in Path(folder).resolve().parents:
        if outer in _held_here or (stop is not None and stop.is_relative_to(outer)):
            return  # this job's own folder, and what is above it was checked when it was taken
        holder = _holder_of(outer)
        if holder is not None:
            raise UserError(
                f"{folder} is inside {outer}, which is in use by another dlscale run{holder}: "
                "wait for it to end, or choose another --out"
            )


def _holder_of(folder: Path) -> str | None:
    """' (pid 123)' (or '') if a live process holds `folder`'s lock; None if none does. Looks
    by taking a shared lock for a moment: a holder's exclusive one refuses it."""
    # O_NONBLOCK: a fifo under the lock's name must not block the open (a service job's
    # folder is its tenant's to fill).
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(folder / LOCK_NAME, flags)
    except OSError:  # no lock file (the usual case), or one this user cannot read
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _holder(fd)
    except OSError:
        return None
    finally:
        os.close(fd)  # and with it the shared lock, if it was taken
    return None
