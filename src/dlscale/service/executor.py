"""Starts, watches and stops job processes for the server, each in the job sandbox, through files
in each job's folder and a record of its process that only the server can read.

A job runs as `python -m dlscale.service.runner JOBDIR` in bubblewrap (service/sandbox.py), in
a cgroup of its own (service/cgroups.py), in a session of its own, so it outlives a server that
crashes. Whether it is alive is read from its folder (the lock it holds), never from this
object's memory, so a restarted server sees the jobs an earlier one started; the sandbox's
outer pid, kept under DIR/sandboxes/, is what a cancel signals (never a pid the job wrote: a
job could name anyone's). Before it is queued, a job's spec is checked by a validation job in
the same sandbox, its folder read-only, with a time limit (`validate`).

Without a sandbox (`dlscale serve --unsafe-single-user`) the same processes run as the server's
own user with no limits: only for one person serving their own jobs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlscale import cgroupfs
from dlscale.atomic import write_json_atomic
from dlscale.service import cgroups, sandbox
from dlscale.service.layout import (
    APPEND,
    CLAIMED,
    LOCK,
    LOG,
    READ_ONLY,
    RESULT,
    open_plain,
    read_result,
)
from dlscale.service.validate import Verdict
from dlscale.service.validators import Validators

INFO_TIMEOUT_S = 30.0  # bubblewrap reports its sandbox's pid within milliseconds


@dataclass(frozen=True)
class Probe:
    alive: bool  # a process holds the job's lock
    claimed: bool  # a process took the job (it may have ended since)
    result: dict | None  # result.json, once written


@dataclass(frozen=True)
class JobLimits:
    """What one job (or its validation) may use, and who it runs as."""

    cpus: int  # CPU slots: whole cores of CPU time
    gpus: int  # GPU slots: the GPU device files are there only when > 0
    memory_bytes: int
    pids: int  # processes and threads at once
    file_bytes: int | None  # no single file larger (the tenant's storage left); None: no limit
    uid: int | None  # an unprivileged uid of its own (a root server); None: bubblewrap's own

    def kernel(self, cpus: int | None = None) -> cgroups.Limits:
        return cgroups.Limits(cpus or self.cpus, self.memory_bytes, self.pids)


def lock_held(folder: Path) -> bool:
    """Whether some process holds the job's runner.lock (tried on a fresh descriptor: a lock
    this process held through another one would not conflict). Opened as every job-written file
    the server reads is: never through a link, nor blocking on a fifo a job put there."""
    try:
        handle = open_plain(Path(folder) / LOCK)
    except FileNotFoundError:
        return False
    with handle:  # closing releases a lock this probe took
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def start_time(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot): a pid and this name one process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[19])


class Executor:
    """The server's hands on job processes: validate, start, probe, cancel, release, reap."""

    def __init__(
        self,
        state_dir: Path,
        hierarchy: cgroups.Hierarchy | None,
        sandboxed: bool = True,
        validations_at_once: int = 1,
        validation_wait_s: float = 120.0,
        warm: JobLimits | None = None,
        uid_of: Callable[[str], int | None] = lambda token: None,
    ) -> None:
        assert hierarchy is not None or not sandboxed, "a sandbox needs its kernel limits"
        self.state_dir = Path(state_dir)  # the server's own: records of the sandboxes' pids
        self.hierarchy = hierarchy
        self.sandboxed = sandboxed
        self.uid_of = uid_of  # the unprivileged uid a validator's sandbox runs as
        self._children: dict[Path, subprocess.Popen] = {}
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.validators = Validators(self, validations_at_once, warm, validation_wait_s)

    # ------------------------------------------------------------------ commands

    def runner_argv(self, folder: Path) -> list[str]:
        # -P: the job folder (its cwd) is not put on sys.path, so no file in it can stand in
        # for a module the job imports (its own code is imported as inputs.NAME on purpose).
        return [sys.executable, "-P", "-m", "dlscale.service.runner", str(folder)]

    def _wrap(
        self, folder: Path, name: str, writable: bool, limits: JobLimits, argv: list[str], cpus=None
    ) -> tuple[list[str], int, int]:
        """(command, info read end, info write end) for `argv` in the sandbox, its cgroup
        made; without a sandbox, `argv` alone (and no pipe: -1, -1)."""
        if not self.sandboxed:
            return argv, -1, -1
        group = cgroups.JobCgroup(self.hierarchy, name)
        group.create(limits.kernel(cpus))
        read_end, write_end = os.pipe()
        box = sandbox.Box(
            Path(folder),
            writable=writable,
            uid=limits.uid,
            gpus=limits.gpus > 0,
            environment={
                "DLSCALE_CPUS": str(cpus or limits.cpus),
                "DLSCALE_MEMORY_BYTES": str(limits.memory_bytes),
                # torch's threads: the cores the job holds, not the machine's
                "OMP_NUM_THREADS": str(cpus or limits.cpus),
            },
            read_only=READ_ONLY,
        )
        inner = sandbox.command(box, argv, info_fd=write_end)
        if limits.file_bytes is not None:  # the kernel refuses a longer file (EFBIG)
            size = max(1, limits.file_bytes)
            inner = ["prlimit", f"--fsize={size}:{size}", "--core=0:0", "--", *inner]
        return cgroupfs.enter_command(group.procs_files(), inner), read_end, write_end

    def _sandbox_pid(self, read_end: int, process: subprocess.Popen) -> int | None:
        """The sandbox's init, as bubblewrap reports it (None if it failed before)."""
        chunks = []
        deadline = time.monotonic() + INFO_TIMEOUT_S
        with os.fdopen(read_end, "rb") as info:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([info], [], [], 0.2)
                if ready:
                    chunk = os.read(info.fileno(), 4096)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    with contextlib.suppress(ValueError):
                        return int(json.loads(b"".join(chunks))["child-pid"])
                elif process.poll() is not None:
                    break
        return None

    # ------------------------------------------------------------------ jobs

    def prepare(self, folder: Path, uid: int | None) -> None:
        """Hand the job's folder to the uid its sandbox runs as (the server wrote it as itself):
        folders 0700, files 0600, links never followed."""
        os.chmod(folder, 0o700)
        for here, dirs, files in os.walk(folder):
            for name in dirs + files:
                path = os.path.join(here, name)
                if not os.path.islink(path):
                    os.chmod(path, 0o700 if name in dirs else 0o600)
                if uid is not None:
                    os.lchown(path, uid, uid)
        if uid is not None:
            os.lchown(folder, uid, uid)

    def start(self, folder: Path, limits: JobLimits) -> int:
        """Spawn the job's process in its sandbox, its output appended to log.txt; returns the
        pid of the process spawned (the sandbox's outer end)."""
        folder = Path(folder)
        name = f"dlscale-job-{folder.name}"
        command, read_end, write_end = self._wrap(
            folder, name, True, limits, self.runner_argv(folder)
        )
        # Not through a link: a job that ran before could have left one in the log's place.
        with os.fdopen(os.open(folder / LOG, APPEND, 0o600), "ab") as log:
            if limits.uid is not None:
                os.fchown(log.fileno(), limits.uid, limits.uid)
            try:
                process = subprocess.Popen(
                    command,
                    cwd=folder,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # not in the server's process group: survives it
                    env=self._environment(),
                    pass_fds=(write_end,) if write_end >= 0 else (),
                )
            finally:
                if write_end >= 0:
                    os.close(write_end)
        init = self._sandbox_pid(read_end, process) if read_end >= 0 else process.pid
        record = {"pid": process.pid, "init": init, "cgroup": name}
        record["started"] = start_time(init) if init is not None else None
        write_json_atomic(self._record(folder), record)
        self._children[folder] = process
        return process.pid

    def _environment(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.sandboxed:  # bubblewrap clears it: only the runner's own survive (sandbox.py)
            return {"PATH": env.get("PATH", "/usr/bin:/bin")}
        return env

    def _record(self, folder: Path) -> Path:
        return self.state_dir / f"{Path(folder).name}.json"

    def _init_of(self, folder: Path) -> int | None:
        """The job's sandbox init (or its runner, unsandboxed) if it is still that process."""
        try:
            record = json.loads(self._record(folder).read_text())
            init, started = int(record["init"]), record.get("started")
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if init <= 1 or started is None or start_time(init) != started:
            return None  # gone, or its pid now names another process
        return init

    def probe(self, folder: Path) -> Probe:
        folder = Path(folder)
        # Result last: a process that ends between the reads is seen with its result.
        alive = lock_held(folder)
        claimed = os.path.lexists(folder / CLAIMED)
        return Probe(alive=alive, claimed=claimed, result=read_result(folder))

    def cancel(self, folder: Path, force: bool = False) -> bool:
        """SIGINT to the job's process group (its workers too), or with `force` SIGKILL to its
        whole sandbox; whether a signal was sent."""
        folder = Path(folder)
        if not force and not lock_held(folder):
            return False
        init = self._init_of(folder)
        if init is None or init == os.getpid():
            return False
        try:
            if force:
                os.kill(init, signal.SIGKILL)  # the sandbox's init: its PID namespace ends
            else:
                os.killpg(init, signal.SIGINT)  # the sandbox's session: the job's processes
        except (ProcessLookupError, PermissionError):
            return False
        if force and self.sandboxed:
            cgroups.JobCgroup(self.hierarchy, f"dlscale-job-{folder.name}").kill()
        return True

    def release(self, folder: Path) -> dict | None:
        """After the job ended: what its cgroup saw (peak memory, OOM kills, tasks refused),
        anything left in it killed, the cgroup and the process record removed."""
        folder = Path(folder)
        usage = None
        if self.sandboxed:
            group = cgroups.JobCgroup(self.hierarchy, f"dlscale-job-{folder.name}")
            if any(path.exists() for path in group.folders.values()):
                usage = group.usage().as_dict()
                group.remove()
        self._record(folder).unlink(missing_ok=True)
        return usage

    def reap(self) -> None:
        """Collect the exit status of this server's ended children, so none stays a zombie."""
        for folder, process in list(self._children.items()):
            if process.poll() is not None:
                del self._children[folder]

    def lost_message(self, folder: Path) -> str:
        """Why a job that was claimed but left no result counts as failed, with its last line."""
        last = last_line(Path(folder) / LOG)
        said = f"; its log ends: {last[:300]}" if last else "; its log is empty"
        return f"the job's process ended without writing {RESULT} (was it killed?){said}"

    def kill_validation(self, name: str, process: subprocess.Popen) -> None:
        """End a validation process: everything in its cgroup, and its process group."""
        if self.sandboxed:
            cgroups.JobCgroup(self.hierarchy, name).kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    def check(self, uid: int | None) -> str | None:
        """Why a sandbox cannot be built here (run once, at start: an empty sandbox runs
        `true` under a cgroup of its own), or None."""
        if not self.sandboxed:
            return None
        missing = sandbox.missing_tools()
        if missing:
            return f"{' and '.join(missing)} not found (Debian: apt-get install bubblewrap)"
        folder = self.state_dir / f"probe-{os.getpid()}"
        folder.mkdir(mode=0o700, exist_ok=True)
        if uid is not None:
            os.chown(folder, uid, uid)
        limits = JobLimits(1, 0, 256 << 20, 64, None, uid)
        name = f"dlscale-probe-{os.getpid()}"
        try:
            command, read_end, write_end = self._wrap(folder, name, False, limits, ["true"])
            try:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    env=self._environment(),
                    pass_fds=(write_end,),
                )
            finally:
                os.close(write_end)
            self._sandbox_pid(read_end, process)  # read: bubblewrap dies writing to no one
            said, _ = process.communicate(timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            cgroups.JobCgroup(self.hierarchy, name).remove()
            folder.rmdir()
        if process.returncode != 0:
            said = " ".join(said.decode(errors="replace").split())[:300]
            return f"a test sandbox failed (exit {process.returncode}): {said}"
        return None

    # ------------------------------------------------------------------ validation

    def validate(self, folder: Path, limits: JobLimits, timeout_s: float) -> Verdict:
        """Run the validation job on a copy of `folder` (read-only, one CPU, the job's memory)
        and return its verdict; ExecutorBusy when others hold every validation place too
        long (validators.py)."""
        return self.validators.validate(Path(folder), limits, timeout_s)

    def close(self) -> None:
        """The server stops: its waiting validators go (its jobs run on)."""
        self.validators.close()


def end_sandboxes(state_dir: Path) -> None:
    """Kill every job sandbox the server's records name (still the same process): for a test or
    a benchmark, which must leave no job behind; a server leaves its jobs running on purpose."""
    for record in Path(state_dir).glob("*.json"):
        try:
            sandbox = json.loads(record.read_text())
            init = int(sandbox["init"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if init > 1 and start_time(init) == sandbox.get("started"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)


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
