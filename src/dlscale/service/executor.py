"""Starts, watches and stops job processes for the server, through files in each job's folder.

A job runs as `python -m dlscale.service.runner JOBDIR` in a session of its own, so it outlives
a server that crashes; whether it is alive is read from its folder (the lock it holds), never
from this object's memory, so a restarted server sees the jobs an earlier one started.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dlscale.service.layout import CLAIMED, LOCK, LOG, PID, RESULT, open_plain, read_result


@dataclass(frozen=True)
class Probe:
    alive: bool  # a process holds the job's lock
    claimed: bool  # a process took the job (it may have ended since)
    result: dict | None  # result.json, once written


def lock_held(folder: Path) -> bool:
    """Whether some process holds the job's runner.lock (tried on a fresh descriptor: a lock
    this process held through another one would not conflict)."""
    try:
        fd = os.open(Path(folder) / LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock this probe took
    return False


class Executor:
    """The server's hands on job processes: start, probe, cancel, reap."""

    def __init__(self) -> None:
        self._children: dict[Path, subprocess.Popen] = {}

    def command(self, job_dir: Path, cpus: int) -> list[str]:
        # -P: the job folder (its cwd) is not put on sys.path, so no file in it can stand in
        # for a module the job imports.
        return [sys.executable, "-P", "-m", "dlscale.service.runner", str(job_dir)]

    def start(self, job_dir: Path, cpus: int = 1) -> int:
        """Spawn the job's process, its output appended to log.txt; returns its pid. `cpus`:
        the CPU slots the job holds (a container executor limits it to them)."""
        job_dir = Path(job_dir)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        # Not through a link: a job that ran before could have left one in the log's place.
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(job_dir / LOG, flags, 0o600), "ab") as log:
            process = subprocess.Popen(
                self.command(job_dir, cpus),
                cwd=job_dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # not in the server's process group: survives its crash
                env=env,
            )
        self._children[job_dir] = process
        return process.pid

    def probe(self, job_dir: Path) -> Probe:
        job_dir = Path(job_dir)
        # Result last: a process that ends between the reads is seen with its result.
        alive = lock_held(job_dir)
        claimed = (job_dir / CLAIMED).exists()
        return Probe(alive=alive, claimed=claimed, result=read_result(job_dir))

    def cancel(self, job_dir: Path) -> bool:
        """SIGINT to the job's process group (its workers too); whether a signal was sent."""
        job_dir = Path(job_dir)
        if not lock_held(job_dir):
            return False
        try:
            pgid = int(json.loads((job_dir / PID).read_text())["pgid"])
        except (OSError, ValueError, KeyError, TypeError):
            return False  # locked but no pid yet: the server asks again on its next tick
        if pgid <= 1 or pgid == os.getpgid(0):  # never the server's own group, nor init's
            return False
        try:
            os.killpg(pgid, signal.SIGINT)
        except ProcessLookupError:
            return False
        return True

    def reap(self) -> None:
        """Collect the exit status of this server's ended children, so none stays a zombie."""
        for job_dir, process in list(self._children.items()):
            if process.poll() is not None:
                del self._children[job_dir]

    def lost_message(self, job_dir: Path) -> str:
        """Why a job that was claimed but left no result counts as failed, with its last line."""
        last = last_line(Path(job_dir) / LOG)
        said = f"; its log ends: {last[:300]}" if last else "; its log is empty"
        return f"the job's process ended without writing {RESULT} (was it killed?){said}"


def last_line(path: Path, window_bytes: int = 65536) -> str | None:
    """The last non-blank line of a file (read from its end: logs can be long)."""
    try:
        with open_plain(path) as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - window_bytes))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else None
