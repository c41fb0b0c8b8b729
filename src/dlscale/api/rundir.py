"""The folder a training run writes to, held by it for the run's life, and what a --resume
continues from there."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dlscale.errors import UserError
from dlscale.launch.base import WorkerFailed
from dlscale.signals import say_on_stop
from dlscale.train import checkpoint as ckpt
from dlscale.train.faults import ERROR_LOG, ending_recorded
from dlscale.train.ownership import claim, claim_new
from dlscale.train.record import RUN_RECORD, recorded
from dlscale.train.reporter import Reporter
from dlscale.train.resume_point import resume_point
from dlscale.train.run_folder import latest_run_dir

# start(run_dir, resume_from, said): the run's record, whose warnings begin with `said` (the
# warnings said before it began); the run writes them into run.json itself.
Start = Callable[[Path, Path | None, list[str]], dict]


def train_in_folder(
    name: str,
    out_dir: str | Path | None,
    resume: bool,
    reporter: Reporter | None,
    start: Start,
    early_warnings: list[str] = (),
) -> dict:
    """Hold the run folder (`out_dir`; for a new run by default a new runs/<name>-<timestamp>;
    for --resume the newest run of `name`), then `start(run_dir, resume_from, said)`: its
    record, whose warnings begin with `said`: `early_warnings` (said, by the caller, before the
    run began) and the checkpoints a resume skipped (said here)."""
    if out_dir is not None:
        owned = claim(Path(out_dir))
    else:
        owned = claim(latest_run_dir(name)) if resume else claim_new(name)
    with owned as run_dir:
        skipped: list[str] = []
        resume_from = None
        if resume:
            resume_from, skipped = resume_point(run_dir)
        else:
            refuse_a_previous_run(run_dir, resumable=True)
        for message in skipped:
            if reporter is not None:
                reporter.warn(message)
        try:
            with ending_recorded(run_dir):
                record = start(run_dir, resume_from, [*early_warnings, *skipped])
        except WorkerFailed as exc:  # a process died or failed: what was saved can continue
            if not ckpt.list_checkpoints(run_dir):
                raise
            raise WorkerFailed(
                f"{exc}; its checkpoints are kept: continue with --resume --out {run_dir}"
            ) from None
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM: --resume only if it was saved
            if not ckpt.list_checkpoints(run_dir):
                say_on_stop(stop, _nothing_saved(run_dir, out_dir is not None))
            else:  # --resume alone takes the newest run of the name: this folder, named
                say_on_stop(stop, f"continue later with --resume --out {run_dir}")
            raise
        return record


def _nothing_saved(run_dir: Path, out_given: bool) -> str:
    """What a run stopped before its first checkpoint tells its user: a rerun starts over; into
    the same --out only once the record it left there is removed (refuse_a_previous_run)."""
    said = "stopped before its first checkpoint, nothing to resume: train again to start over"
    record = Path(run_dir) / RUN_RECORD
    if out_given and record.exists():
        return f"{said} (remove {record} first, or choose another --out)"
    return said


def refuse_a_previous_run(run_dir: Path, resumable: bool) -> None:
    """One line if a new run in `run_dir` would replace what an earlier one left there: its
    checkpoints (`resumable`: --resume continues them), its record or its errors.log."""
    if ckpt.list_checkpoints(run_dir):
        how = "pass --resume to continue it, or choose another --out" if resumable else None
        raise UserError(
            f"{run_dir} already holds checkpoints of a run: {how or 'choose another --out'}"
        )
    kept = [name for name in (RUN_RECORD, ERROR_LOG) if (Path(run_dir) / name).exists()]
    if kept:
        raise UserError(
            f"{run_dir} already holds a run's {' and '.join(kept)}{_status(run_dir)} and no "
            f"checkpoint to resume: a new run would replace {'them' if len(kept) > 1 else 'it'}; "
            f"remove {' and '.join(kept)} to train there anew, or choose another --out"
        )


def _status(run_dir: Path) -> str:
    """' (status: failed)' from the run's record, or nothing."""
    status = (recorded(run_dir) or {}).get("status")
    return f" (status: {status})" if isinstance(status, str) else ""
