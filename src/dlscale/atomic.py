"""Atomic file writes: a reader sees the old file or the whole new one, never half; a write
that fails (a full disk, a read-only or vanished folder) is one line naming the file and why.
Every layer writes through it, as it raises errors.py's errors."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from dlscale.errors import UserError, os_reason
from dlscale.signals import interrupt_behind

TEMP_NAME_TRIES = 100  # 48 random bits a name: a clash is someone else's file, tried again


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


@contextlib.contextmanager
def temp_beside(path: Path) -> Iterator[tuple[IO[bytes], str]]:
    """A new file open for binary writing in `path`'s folder (`.NAME.RANDOM.tmp`, mode 0600) and
    its name; removed when the block raises, closed when it ends. Its name is chosen before the
    file exists: a Ctrl-C or SIGTERM raised as `open` returns (after the kernel made the file,
    before the caller holds it) still finds it. `tempfile.mkstemp` names it only once it
    returns, and such a stop left the file behind."""
    name = None
    try:
        for _ in range(TEMP_NAME_TRIES):
            name = str(path.parent / f".{path.name[:64]}.{secrets.token_hex(6)}.tmp")
            try:
                fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                break
            except FileExistsError:
                name = None  # someone else's: never removed here
        else:
            raise FileExistsError(f"no free temporary name beside {path}")
        with os.fdopen(fd, "wb") as handle:
            yield handle, name
    except BaseException:
        if name is not None:
            with contextlib.suppress(OSError):
                os.unlink(name)
        raise


def write_atomic(path: Path, write: Callable[[IO[bytes]], None], shared: bool = False) -> None:
    """Write through `write(file)` into a temp file beside `path`, fsync it, then rename over;
    an OSError on the way (a full disk) is a WriteFailed naming `path` and the real cause.
    The file is private (0600, as its temp file is made) unless `shared`: then it takes the mode
    a plain new file would (0666 less the umask), as data meant for others to read must."""
    path = Path(path)
    recorder = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with temp_beside(path) as (handle, tmp_name):
            recorder = _Recorder(handle)
            write(recorder)  # type: ignore[arg-type]
            handle.flush()
            if shared:
                os.fchmod(handle.fileno(), 0o666 & ~current_umask())
            os.fsync(handle.fileno())
            os.replace(tmp_name, path)
    except BaseException as exc:
        stop = interrupt_behind(exc)
        if stop is not None:  # Ctrl-C or SIGTERM: the run stops as interrupted, not failed
            raise stop from None
        cause = recorder.error if recorder is not None and recorder.error else exc
        if isinstance(exc, Exception) and isinstance(cause, OSError):
            raise WriteFailed(f"cannot write {path}: {os_reason(cause)}") from None
        raise
    _fsync_dir(path.parent)


def write_json_atomic(path: Path, record: Any, shared: bool = False) -> None:
    text = json.dumps(record, indent=2, sort_keys=False, default=str) + "\n"
    write_atomic(path, lambda handle: handle.write(text.encode()), shared)


def current_umask() -> int:
    """This process's umask, read from /proc (setting it to read it back would race with
    other threads creating files); 0o022 where /proc does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


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
