"""Run folders and atomic file writes: a reader sees the old file or the new one, never half."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

DEFAULT_RUNS_DIR = Path("runs")


def write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write through `write(file)` into a temp file beside `path`, fsync it, then rename over."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)


def write_json_atomic(path: Path, record: Any) -> None:
    text = json.dumps(record, indent=2, sort_keys=False, default=str) + "\n"
    write_atomic(path, lambda handle: handle.write(text.encode()))


def _fsync_dir(folder: Path) -> None:
    """The rename itself is durable only once the folder's entry is on disk."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def new_run_dir(name: str, root: Path = DEFAULT_RUNS_DIR) -> Path:
    """runs/<name>-<UTC timestamp>, with a suffix if two runs start in the same second."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    candidate = root / f"{name}-{stamp}"
    suffix = 1
    while candidate.exists():
        suffix += 1
        candidate = root / f"{name}-{stamp}-{suffix}"
    return candidate
