"""Run folders' names: runs/<name>-<UTC timestamp> under the default root."""

from __future__ import annotations

import time
from pathlib import Path

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
