"""Atomic file writes: a reader sees the old file or the whole new one, never half; a write
that fails (a full disk, a read-only or vanished folder) is one line naming the file and why.
Every layer writes through it, as it raises errors.py's errors."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from dlscale.errors import UserError, os_reason
from dlscale.signals import interrupt_behind


class WriteFailed(UserError):
    """A file could not be written (a full disk, a read-only or vanished folder): one line
    naming the file and the operating system's reason; the old file, if any, is untouched."""


class _Recorder:
    """A file that keeps the first OSError its writes raised: torch.save reports a failed write
    as 'unexpected pos 415232 vs 415124' and the cause (a full disk) would be lost."""

    def __init__(self, handle: IO[bytes]):
        self._handle = handle
        self.error: OSError | None = None

    def write(self, data) -> int:
        try:
            return self._handle.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def __getattr__(self, name: str) -> Any:  # seek, tell, flush, fileno: the file's own
        return getattr(self._handle, name)


def write_atomic(path: Path, write: Callable[[IO[bytes]], None]) -> None:
    """Write through `write(file)` into a temp file beside `path`, fsync it, then rename over;
    an OSError on the way (a full disk) is a WriteFailed naming `path` and the real cause."""
    path = Path(path)
    recorder = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise WriteFailed(f"cannot write {path}: {os_reason(exc)}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            recorder = _Recorder(handle)
            write(recorder)  # type: ignore[arg-type]
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_name)
        stop = interrupt_behind(exc)
        if stop is not None:  # Ctrl-C or SIGTERM: the run stops as interrupted, not failed
            raise stop from None
        cause = recorder.error if recorder is not None and recorder.error else exc
        if isinstance(exc, Exception) and isinstance(cause, OSError):
            raise WriteFailed(f"cannot write {path}: {os_reason(cause)}") from None
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
