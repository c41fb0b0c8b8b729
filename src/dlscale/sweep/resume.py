"""A sweep folder across runs of `dlscale sweep`: sweep.json names the spec it belongs to, and
on --resume every trial saved (trials/tNNN/trial.json) and every run's result.json are read
back."""

from __future__ import annotations

import json
from pathlib import Path

from dlscale.atomic import write_json_atomic
from dlscale.errors import UserError
from dlscale.jobspec import Spec
from dlscale.sweep.trials import Run
from dlscale.train.ownership import LOCK_NAME

STATE = "sweep.json"
# What a run's result.json gives back on --resume.
RESULT_KEYS = (
    "val_accuracy",
    "val_loss",
    "wall_s",
    "steps",
    "node",
    "host",
    "global_batch_size",
    "setup_s",
    "slot",
    "pid",
    "began_at",
    "ended_at",
)


def open_folder(
    out_dir: Path, spec: Spec, spec_path: str, started_at: str, resume: bool
) -> tuple[bool, str]:
    """A new sweep's sweep.json written (False, `started_at`); or, to resume, the folder's
    checked to hold a sweep of this spec (True: its trials are to be read back; and when the
    sweep first began)."""
    state_path = out_dir / STATE
    spec_hash = spec.spec_hash()
    if state_path.is_file() and not resume:
        raise UserError(
            f"{out_dir} already holds a sweep: pass --resume to continue it, or choose "
            "another --out"
        )
    if not resume and any(p.name != LOCK_NAME for p in out_dir.iterdir()):
        raise UserError(
            f"{out_dir} holds files and no sweep ({STATE}): a sweep would write over them; "
            "choose another --out"
        )
    if not resume:
        state = {"spec_hash": spec_hash, "spec": spec_path, "started_at": started_at}
        write_json_atomic(state_path, state)
        return False, started_at
    if not state_path.is_file():
        raise UserError(f"nothing to resume: {out_dir} holds no sweep ({STATE})")
    state = read_json(state_path)
    saved_hash = state.get("spec_hash") if isinstance(state, dict) else None
    if saved_hash != spec_hash:
        raise UserError(
            f"{out_dir} holds a sweep of a different spec (hash {saved_hash}, this "
            f"spec {spec_hash}); start a new sweep with another --out"
        )
    return True, state.get("started_at", started_at)


def saved_trials(out_dir: Path) -> list[tuple[Path, dict]]:
    """(trial.json's path, what it holds) of every trial saved, in trial order."""
    found = sorted(
        (out_dir / "trials").glob("t*/trial.json"),
        key=lambda path: int(path.parent.name[1:]),
    )  # t999 before t1000
    return [(path, read_json(path)) for path in found]


def restore_run(run: Run) -> bool:
    """A run's status, error, curve and figures from its result.json; False if it has none."""
    result_path = run.dir / "result.json"
    if not result_path.is_file():
        return False
    saved = read_json(result_path)
    run.status, run.error = saved["status"], saved["error"]
    run.curve = saved["curve"]
    run.result = {k: saved.get(k) for k in RESULT_KEYS}
    return True


def read_json(path: Path):
    """A sweep file's JSON; one line naming the file where it is torn or unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = getattr(exc, "msg", None) or getattr(exc, "strerror", None) or str(exc)
        raise UserError(
            f"{path}: not readable as JSON ({reason}); restore it, or start the sweep anew "
            "with another --out"
        ) from None
