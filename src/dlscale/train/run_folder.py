"""Where runs write: runs/<name>-<UTC timestamp> folders, made with one line when they cannot
be, and the newest one of a name (what a bare --resume continues).

Holding a folder for a run's life (the lock) is ownership.py's job.
"""

from __future__ import annotations

import errno
import re
import time
from pathlib import Path

from dlscale.errors import UserError, os_reason
from dlscale.train import checkpoint as ckpt

DEFAULT_RUNS_DIR = Path("runs")


def new_run_dir(name: str, root: Path = DEFAULT_RUNS_DIR) -> Path:
    """runs/<name>-<UTC timestamp>, with a suffix if two runs start in the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    candidate = root / f"{name}-{stamp}"
    suffix = 1
    while candidate.exists():
        suffix += 1
        candidate = root / f"{name}-{stamp}-{suffix}"
    return candidate


def check_folder(folder: Path) -> bool:
    """Make `folder` (and its parents) unless it exists; one line when it cannot be a folder.
    True if it was made here."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file, not a folder: choose another --out")
    try:
        existed = folder.is_dir()
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(folder_problem(folder, exc)) from None
    return not existed


def folder_problem(folder: Path, exc: OSError) -> str:
    """Why `folder` cannot be made or written, in the words a person acts on."""
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        blocker = next(
            (p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), folder
        )
        return f"{blocker} is a file, not a folder: choose another --out"
    if exc.errno == errno.EROFS:
        return f"{folder} is on a read-only file system: choose another --out"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"{folder}: permission denied (this user cannot write there): choose another --out"
    return f"cannot create the folder {folder}: {os_reason(exc)}"


def output_dir(bench: str, out: str | Path | None = None) -> Path:
    """`out`, or runs/bench-<bench>-<UTC timestamp>/; created (one line if it cannot be)."""
    folder = Path(out) if out is not None else new_run_dir(f"bench-{bench}")
    check_folder(folder)
    return folder


def latest_run_dir(name: str, root: Path = DEFAULT_RUNS_DIR) -> Path:
    """The newest runs/<name>-* folder holding a checkpoint: what a bare --resume continues."""
    candidates = [p for p in root.glob(f"{name}-*") if ckpt.list_checkpoints(p)]
    if not candidates:
        raise UserError(
            f"nothing to resume: no run of '{name}' with checkpoints under {root}/ "
            "(pass --out DIR to name the run folder)"
        )
    return max(candidates, key=lambda p: ckpt.list_checkpoints(p)[-1][1].stat().st_mtime)


def latest_sweep_dir(name: str, root: Path = DEFAULT_RUNS_DIR) -> Path:
    """The newest runs/sweep-<name>-* folder: what a bare `sweep --resume` continues."""
    own = re.compile(rf"^sweep-{re.escape(name)}-\d{{8}}-\d{{6}}(-\d+)?$")  # not sweep-{name}-x-...
    candidates = [
        p
        for p in root.glob(f"sweep-{name}-*")
        if own.match(p.name) and (p / "sweep.json").is_file()
    ]
    if not candidates:
        raise UserError(
            f"nothing to resume: no sweep of '{name}' under {root}/ (pass --out DIR to name it)"
        )
    return max(candidates, key=lambda p: (p / "sweep.json").stat().st_mtime)
