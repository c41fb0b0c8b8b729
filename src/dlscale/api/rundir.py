"""The folder a training run writes to, held by it for the run's life, and what a --resume
continues from there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dlscale.atomic import write_json_atomic
from dlscale.errors import UserError
from dlscale.launch.base import WorkerFailed
from dlscale.train import checkpoint as ckpt
from dlscale.train.faults import ending_recorded
from dlscale.train.ownership import claim, claim_new
from dlscale.train.reporter import Reporter
from dlscale.train.resume_point import resume_point
from dlscale.train.run_folder import latest_run_dir

Start = Callable[[Path, Path | None], dict]


def train_in_folder(
    name: str,
    out_dir: str | Path | None,
    resume: bool,
    reporter: Reporter | None,
    start: Start,
    early_warnings: list[str] = (),
) -> dict:
    """Hold the run folder (`out_dir`; for a new run by default a new runs/<name>-<timestamp>;
    for --resume the newest run of `name`), then `start(run_dir, resume_from)`: its record,
    whose warnings begin with `early_warnings` (said, by the caller, before the run began)."""
    if out_dir is not None:
        owned = claim(Path(out_dir))
    else:
        owned = claim(latest_run_dir(name)) if resume else claim_new(name)
    with owned as run_dir:
        skipped: list[str] = []
        resume_from = None
        if resume:
            resume_from, skipped = resume_point(run_dir)
        elif ckpt.list_checkpoints(run_dir):
            raise UserError(
                f"{run_dir} already holds checkpoints of a run: pass --resume to continue it, "
                "or choose another --out"
            )
        for message in skipped:
            if reporter is not None:
                reporter.warn(message)
        try:
            with ending_recorded(run_dir):
                record = start(run_dir, resume_from)
        except WorkerFailed as exc:  # a process died or failed: what was saved can continue
            if not ckpt.list_checkpoints(run_dir):
                raise
            raise WorkerFailed(
                f"{exc}; its checkpoints are kept: continue with --resume --out {run_dir}"
            ) from None
        before = [*early_warnings, *skipped]
        if before:  # said before the run began, so the run's own record did not have them
            record["warnings"] = before + record["warnings"]
            with ckpt.naming_intact(run_dir):
                write_json_atomic(run_dir / "run.json", record)
        return record
