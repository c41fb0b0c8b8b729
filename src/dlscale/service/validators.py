"""Validation jobs, started before they are needed.

Checking a spec takes a fresh process seconds of imports (torch, scikit-learn, dlscale) before it
reads one byte of the spec: most of a submit's time. So the server keeps `warm` validators
waiting: each a fresh sandbox of its own (its own uid, cgroup and namespaces, an empty folder of
its own bound read-only), started before any tenant is known, that has done its imports and
waits for one line on its stdin. A submission takes one, the server copies the job's spec,
job.json and inputs into its folder, sets its cgroup to the job's limits, and sends the go; the
validator checks, prints its verdict and exits, and a new one is started in its place. Each
validator serves one submission only: no tenant's code ever runs where another's has run.

Without warm validators (the container executor) a validator is started for each submission,
with the job's own limits, and told to go at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from dlscale.service import cgroups
from dlscale.service.layout import INPUTS, JOB_FILE, MODEL, SPEC_FILE
from dlscale.service.uploads import copy_inputs
from dlscale.service.validate import Verdict, bounded_output, read_verdict

FOLDERS = "validators"  # under the executor's state folder: one empty folder per validator


class ExecutorBusy(Exception):
    """Too many validations at once: the submit is answered 503, to be retried."""


@dataclass
class Validator:
    """One waiting validation process, in its sandbox, with its folder and cgroup."""

    process: subprocess.Popen
    folder: Path  # bound read-only into its sandbox: the job's files are copied here
    name: str  # its cgroup's
    uid: int | None


class Validators:
    """The server's validation places: at most `at_once` run together, and `warm` (when
    given: the limits a waiting one starts with) of them wait ready."""

    def __init__(self, executor, at_once: int, warm, wait_s: float):
        self.executor = executor
        self.warm = warm
        self.wait_s = wait_s
        self.root = executor.state_dir / FOLDERS
        self._places = threading.BoundedSemaphore(max(1, at_once))
        self._lock = threading.Lock()
        self._waiting: deque[Validator] = deque()
        self._closed = False
        if warm is not None:
            self._sweep()
            for _ in range(max(1, at_once)):
                self._waiting.append(self._spawn(warm))

    def _sweep(self) -> None:
        """Folders a crashed server's validators left (their processes ended with its pipe)."""
        if self.root.is_dir():
            for folder in self.root.iterdir():
                shutil.rmtree(folder, ignore_errors=True)
                if self.executor.sandboxed:
                    cgroups.JobCgroup(self.executor.hierarchy, _cgroup(folder.name)).remove()

    def _spawn(self, limits) -> Validator:
        """A validator in a new sandbox, importing what checking a spec needs, then waiting."""
        token = secrets.token_hex(8)
        folder = self.root / token
        folder.mkdir(mode=0o700, parents=True)
        uid = self.executor.uid_of(token)
        if uid is not None:
            os.chown(folder, uid, uid)
        limits = dataclasses.replace(limits, uid=uid)
        argv = [sys.executable, "-P", "-m", "dlscale.service.validate", "--wait", str(folder)]
        name = _cgroup(token)
        command, read_end, write_end = self.executor._wrap(folder, name, False, limits, argv, 1)
        try:
            process = subprocess.Popen(
                command,
                cwd=folder,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.executor._environment(),
                pass_fds=(write_end,) if write_end >= 0 else (),
            )
        finally:
            if write_end >= 0:
                os.close(write_end)
        if read_end >= 0:  # read: bubblewrap dies writing to a closed pipe
            self.executor._sandbox_pid(read_end, process)
        return Validator(process, folder, name, uid)

    def validate(self, folder: Path, limits, timeout_s: float) -> Verdict:
        """The verdict of a validator on a copy of `folder`'s spec, job.json and inputs."""
        if not self._places.acquire(timeout=self.wait_s):
            raise ExecutorBusy("the server is busy checking other submissions; try again soon")
        try:
            validator = self._take(limits)
            self._refill()  # its successor does its imports while this one checks
            try:
                return self._run(validator, folder, limits, timeout_s)
            finally:
                self._discard(validator)
        finally:
            self._places.release()

    def _take(self, limits) -> Validator:
        with self._lock:
            while self._waiting:
                validator = self._waiting.popleft()
                if validator.process.poll() is None:
                    return validator
                self._discard(validator)  # died waiting (killed, out of memory): a new one
        return self._spawn(limits)

    def _refill(self) -> None:
        with self._lock:
            if self.warm is not None and not self._closed:
                self._waiting.append(self._spawn(self.warm))

    def _run(self, validator: Validator, folder: Path, limits, timeout_s: float) -> Verdict:
        _copy_job(folder, validator.folder)
        self.executor.prepare(validator.folder, validator.uid)
        if self.executor.sandboxed:  # the job's memory and tasks; one CPU still
            group = cgroups.JobCgroup(self.executor.hierarchy, validator.name)
            group.create(cgroups.Limits(1, limits.memory_bytes, limits.pids))
        go = {"cpus": limits.cpus, "memory_bytes": limits.memory_bytes}
        with contextlib.suppress(BrokenPipeError):
            validator.process.stdin.write((json.dumps(go) + "\n").encode())
            validator.process.stdin.close()
        output, timed_out = bounded_output(validator.process, timeout_s)
        if timed_out:
            self.executor.kill_validation(validator.name, validator.process)
        validator.process.wait()
        usage = None
        if self.executor.sandboxed:
            usage = cgroups.JobCgroup(self.executor.hierarchy, validator.name).usage()
        output = output.replace(f"{validator.folder}/", "")
        code = validator.process.returncode
        return read_verdict(output, code, timed_out, timeout_s, usage, limits.memory_bytes)

    def _discard(self, validator: Validator) -> None:
        """End a validator (and everything it started), remove its cgroup and folder."""
        if validator.process.poll() is None:
            self.executor.kill_validation(validator.name, validator.process)
        with contextlib.suppress(subprocess.TimeoutExpired):
            validator.process.wait(timeout=10)
        for stream in (validator.process.stdin, validator.process.stdout):
            with contextlib.suppress(OSError, ValueError):
                stream.close()
        if self.executor.sandboxed:
            cgroups.JobCgroup(self.executor.hierarchy, validator.name).remove()
        shutil.rmtree(validator.folder, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
        for validator in waiting:
            self._discard(validator)


def _cgroup(token: str) -> str:
    return f"dlscale-validate-{token}"


def _copy_job(source: Path, target: Path) -> None:
    """What a validation reads of a job, copied into the validator's folder: the spec, job.json,
    the inputs and a deployment's model (their regular files only)."""
    for name in (SPEC_FILE, JOB_FILE):
        shutil.copyfile(source / name, target / name, follow_symlinks=False)
    copy_inputs(source / INPUTS, target / INPUTS)
    copy_inputs(source / MODEL, target / MODEL)
