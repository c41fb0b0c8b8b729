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

import os
import shutil
import stat
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


def copy_model(source: Path, target: Path) -> None:
    """The model of the job in `source` into the deployment's folder `target`: its run record
    and checkpoints as model/, its own code as inputs/; UserError when it saved no model."""
    run = source / RUN
    if not _copy_file(run / RUN_RECORD, target / MODEL / RUN_RECORD):
        raise UserError(f"the job left no {RUN}/{RUN_RECORD}, so its model cannot be rebuilt")
    copied = _copy_tree(run / CHECKPOINTS, target / MODEL / CHECKPOINTS, lambda name: True)
    if not copied:
        raise UserError("the job saved no checkpoint, so it has no model to deploy")
    _copy_tree(source / INPUTS, target / INPUTS, lambda name: name.endswith(CODE_SUFFIX))


def _copy_file(source: Path, target: Path) -> bool:
    """Copy `source` if it is a regular file (never through a link); whether it was."""
    try:
        fd = os.open(source, _READ)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(target, "xb") as dst:
            shutil.copyfileobj(src, dst)
    return True


def _copy_tree(source: Path, target: Path, wanted) -> int:
    """Copy the regular files under `source` whose names `wanted` accepts, never entering a
    linked folder; how many were copied."""
    if source.is_symlink() or not source.is_dir():
        return 0
    copied = 0
    for here, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(here, d))]
        into = target / os.path.relpath(here, source)
        for name in sorted(files):
            if wanted(name):
                copied += _copy_file(Path(here) / name, into / name)
    return copied
