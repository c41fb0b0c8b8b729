"""A finished train job's model as a job of its own (kind serve-model): which jobs can be
deployed, with which options, and the new job's folder filled from the old one's run.

The deployment's folder gets a copy of the run the model is rebuilt from (run.json and the
checkpoints, under model/, read-only to the job) and of the tenant's own code (inputs/**.py: a
model factory `inputs.NAME:build` is imported again), nothing else. A copy, not hard links: a
file with two links is never served as an artifact (layout.py), and handing the folder to the
deployment's uid would hand the original's files with it. Only regular files are copied, opened
without following links (the original job wrote its run, so it may have left links there).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from dlscale.errors import UserError
from dlscale.service.layout import INPUTS, MODEL, RUN

SERVE_KIND = "serve-model"
DEVICES = ("cpu", "cuda")
PRECISIONS = ("fp32", "bf16", "int8")
RUN_RECORD = "run.json"
CHECKPOINTS = "checkpoints"
CODE_SUFFIX = ".py"
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class DeployOptions:
    """How the model is served: where, and at which precision (serve-model's own options; its
    batching and replicas are Ray Serve's, which a job does not run: see docs/serving.md)."""

    device: str = "cpu"
    precision: str = "fp32"

    def check(self) -> None:
        if self.device not in DEVICES:
            raise UserError(f"device: '{self.device}' is not one of {', '.join(DEVICES)}")
        if self.precision not in PRECISIONS:
            raise UserError(f"precision: '{self.precision}' is not one of {', '.join(PRECISIONS)}")
        if self.precision == "int8" and self.device == "cuda":
            raise UserError("precision int8 runs on the CPU only: use device cpu")

    @property
    def slots(self) -> tuple[int, int]:
        """(cpu, gpu) slots the deployment holds while it serves: its one process, and a GPU
        when it serves on one."""
        return 1, 1 if self.device == "cuda" else 0

    def spec_text(self, source_id: str) -> str:
        """What the job's page shows as its spec: what it serves, and how."""
        return (
            f"# kind {SERVE_KIND}: the model of job {source_id}, served until cancelled\n"
            f"deploy: {{job: {source_id}, device: {self.device}, precision: {self.precision}}}\n"
        )


class Claims:
    """Tenants with a deployment being made now: one at a time each, so that concurrent deploys
    cannot each copy up to the same storage left (it is read before the copy and charged only
    once the job is queued)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.held: set[str] = set()

    def claim(self, tenant: str) -> bool:
        """Whether `tenant` may start a deployment now (then release() it once queued)."""
        with self._lock:
            if tenant in self.held:
                return False
            self.held.add(tenant)
            return True

    def release(self, tenant: str) -> None:
        with self._lock:
            self.held.discard(tenant)


DEPLOYING = Claims()  # per server process: the routes run in its threads


def refusal(kind: str, state: str, job_id: str) -> tuple[int, str] | None:
    """(HTTP status, one line) when job `job_id` has no model to deploy, else None."""
    if kind != "train":
        return 422, (
            f"job {job_id} is a {kind} job: only a train job leaves one model to deploy "
            "(a sweep's trials and a profile leave none)"
        )
    if state != "succeeded":
        return 409, f"job {job_id} is {state}: only a succeeded job's model can be deployed"
    return None


def copy_model(source: Path, target: Path, budget_bytes: int | None = None) -> None:
    """The model of the job in `source` into the deployment's folder `target`: its run record
    and checkpoints as model/, its own code as inputs/; UserError when it saved no model, when a
    file it would copy has several links, or once the copy passes `budget_bytes` (the tenant's
    storage left), checked as it copies.

    Every name below `source` is opened relative to its folder and never through a link: the
    job owned its folder, so it may have left a link where its run was (to another job's run)."""
    copy = _Copy(budget_bytes)
    with _folder(None, source) as job:
        if job is None:  # deleted meanwhile; a descriptor of None would mean the server's cwd
            raise UserError("the job's folder is gone, so its model cannot be copied")
        with _folder(job, RUN) as run:
            if run is None or not copy.file(run, RUN_RECORD, target / MODEL / RUN_RECORD):
                raise UserError(
                    f"the job left no {RUN}/{RUN_RECORD} of its own, so its model cannot be rebuilt"
                )
            if not copy.tree(run, CHECKPOINTS, target / MODEL / CHECKPOINTS, lambda name: True):
                raise UserError("the job saved no checkpoint, so it has no model to deploy")
        copy.tree(job, INPUTS, target / INPUTS, lambda name: name.endswith(CODE_SUFFIX))


class _folder(contextlib.AbstractContextManager):
    """A folder opened by name inside the folder `parent` (a descriptor; None: `name` is a
    path), never through a link; None where it is not a folder of its own."""

    def __init__(self, parent: int | None, name: str | Path):
        try:
            self.fd = os.open(name, _DIRECTORY, dir_fd=parent)
        except OSError:
            self.fd = None

    def __enter__(self) -> int | None:
        return self.fd

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)


class _Copy:
    """Regular files copied out of descriptors, their bytes counted against a budget."""

    def __init__(self, budget_bytes: int | None):
        self.budget = budget_bytes
        self.copied = 0

    def file(self, folder: int, name: str, target: Path) -> bool:
        """Copy `name` in `folder` if it is a regular file with one link; whether it was."""
        try:
            fd = os.open(name, _READ, dir_fd=folder)
        except OSError:
            return False
        with os.fdopen(fd, "rb") as src:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return False
            if info.st_nlink != 1:
                # The storage quota counts such a file as nothing (layout.folder_bytes).
                raise UserError(
                    f"{name} has {info.st_nlink} links: a model is copied from files of its own"
                )
            self.copied += info.st_size
            if self.budget is not None and self.copied > self.budget:
                raise UserError(
                    f"the model's files pass the tenant's storage quota "
                    f"({self.budget:,} bytes left)"
                )
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(target, "xb") as dst:
                shutil.copyfileobj(src, dst)
        return True

    def tree(self, parent: int, name: str, target: Path, wanted) -> int:
        """Copy the regular files under the folder `name` in `parent` whose names `wanted`
        accepts, never entering a linked folder; how many were copied."""
        with _folder(parent, name) as top:
            if top is None:
                return 0
            copied = 0
            for here, _, files, fd in os.fwalk(".", dir_fd=top, follow_symlinks=False):
                for file in sorted(files):
                    if wanted(file):
                        copied += self.file(fd, file, target / here / file)
            return copied
