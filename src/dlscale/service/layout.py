"""A job's folder: its file names, how the server writes it, and how anyone reads it safely.

The folder is shared by two processes that never talk: the server writes `job.json`, `spec.yaml`
and `inputs/` before the job starts; the job process (service/runner.py) writes everything else.
Whatever a job wrote is untrusted (a model factory can write anything, symlinks included), so
files are listed and opened without following symlinks, only regular files inside the folder
with a single link are ever handed out (a hard link could name a file of someone else's), and
what the server parses of them (result.json, run.json, metrics) is read up to a bound.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from dlscale.atomic import write_json_atomic
from dlscale.errors import UserError

JOBS = "jobs"
JOB_FILE = "job.json"
SPEC_FILE = "spec.yaml"
INPUTS = "inputs"
RUN = "run"
LOG = "log.txt"
METRICS = "metrics.jsonl"
LOCK = "runner.lock"
CLAIMED = "claimed"
PID = "pid"
RESULT = "result.json"
PROFILE = "profile.json"  # a profile job's output, under run/
MODEL = "model"  # a deployment's copy of the run it serves (run.json and checkpoints/)
SOCKET = "serve.sock"  # where a deployment's engine listens (a Unix socket: no network)
# What a job may read but not change: what the server wrote for it before it started.
READ_ONLY = (INPUTS, SPEC_FILE, JOB_FILE, MODEL)
TOP_ARTIFACTS = (LOG, METRICS, RESULT)  # beside run/, the files a job's owner may download

_JOB_ID = re.compile(r"[0-9a-f]{16}")
TAIL_CHUNK_BYTES = 1 << 20  # one read of a log; a longer line is sent in pieces of this size
MAX_PARSED_BYTES = 4 << 20  # of a job's JSON the server reads: result, run record, metrics
# Appending to a file in a job's folder, made if missing: never through a link planted there.
APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def job_dir(data_dir: str | Path, job_id: str) -> Path:
    """DIR/jobs/<job_id>; the id is the server's own (16 hex digits), never a client's path."""
    if not isinstance(job_id, str) or not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    return Path(data_dir) / JOBS / job_id


def check_input_name(name: str) -> str:
    """A single plain file name for an uploaded input, or a UserError naming the problem."""
    bad = (
        not name
        or any(mark in name for mark in ("/", "\\", "\x00"))
        or name.startswith(".")  # hidden files, and "." and ".."
    )
    if bad:
        raise UserError(f"input '{name}': give a plain file name (no folders, no leading dot)")
    return name


def write_job(
    folder: str | Path, job: dict, spec_text: str, inputs: dict[str, bytes] | None = None
) -> Path:
    """Create a job's folder with spec.yaml (the text as given), job.json and inputs/."""
    folder = Path(folder)
    for name in inputs or {}:
        check_input_name(name)  # all checked before anything is written
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.mkdir(mode=0o700)  # a fresh id: an existing folder would be another job's
    (folder / SPEC_FILE).write_text(spec_text)
    (folder / INPUTS).mkdir(mode=0o700)
    for name, data in (inputs or {}).items():
        with open(folder / INPUTS / name, "xb") as handle:
            handle.write(data)
    write_json_atomic(folder / JOB_FILE, job)
    return folder


def _plain(fd: int, name: str) -> None:
    """A regular file with one link, or FileNotFoundError (and `fd` closed)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise FileNotFoundError(name)


def open_plain(path: str | Path) -> BinaryIO:
    """Open a file a job wrote, for the server to read: never through a symlink (a job could
    point its log at another tenant's files), and only a regular file with one link; else
    FileNotFoundError."""
    # O_NONBLOCK: a fifo in its place must not block the open.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        raise FileNotFoundError(str(path)) from None
    _plain(fd, str(path))
    return os.fdopen(fd, "rb")


def read_bounded(handle: BinaryIO, what: str) -> bytes:
    """All of a job-written file the server parses, or ValueError past MAX_PARSED_BYTES."""
    data = handle.read(MAX_PARSED_BYTES + 1)
    if len(data) > MAX_PARSED_BYTES:
        raise ValueError(f"{what} is over {MAX_PARSED_BYTES} bytes")
    return data


def append_line(path: str | Path, line: str) -> None:
    """The server's own line at the end of a job's log: never through a link, never a file
    with other links, never blocking on a fifo; silently skipped when the log is not plain."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
        _plain(fd, str(path))
    except OSError:
        return
    with os.fdopen(fd, "ab") as handle:
        handle.write(f"{' '.join(line.split())}\n".encode())


def remove_job_dir(folder: str | Path) -> None:
    """Delete a job's folder (rmtree never follows the links a job left in it)."""
    shutil.rmtree(folder, ignore_errors=True)


def read_result(folder: str | Path) -> dict | None:
    """The job process's result.json, or None while it has written none."""
    path = Path(folder) / RESULT
    try:
        with open_plain(path) as handle:
            text = read_bounded(handle, RESULT).decode(errors="replace")
    except FileNotFoundError:
        if not os.path.lexists(path):
            return None
        text = ""  # a link or a fifo in its place: not the job process's doing
    except ValueError:
        text = ""  # larger than any result the runner writes
    try:
        result = json.loads(text)
    except ValueError:
        result = None
    if not isinstance(result, dict):  # written atomically, so only a foreign hand does this
        return {"state": "failed", "message": f"{RESULT} is not a JSON object in a plain file"}
    return result


def _regular_files(root: Path, top: Path):
    """(relative name, lstat) of the regular files under `root`, symlinks never followed, and
    none whose real path leaves `top`."""
    top_real = os.path.realpath(top)
    for here, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(here, name)
            info = os.lstat(path)
            if not stat.S_ISREG(info.st_mode):  # symlinks, fifos, sockets, devices
                continue
            if info.st_nlink != 1:  # a hard link: its bytes may be someone else's file
                continue
            real = os.path.realpath(path)
            if os.path.commonpath([real, top_real]) != top_real:
                continue
            yield PurePosixPath(os.path.relpath(path, top)).as_posix(), info


def folder_bytes(path: str | Path) -> int:
    """Bytes of the regular files under `path` (symlinks are neither followed nor counted)."""
    path = Path(path)
    if not path.is_dir() or path.is_symlink():
        return 0
    return sum(info.st_size for _, info in _regular_files(path, path))


def list_artifacts(folder: str | Path) -> list[tuple[str, int, str]]:
    """(name, size in bytes, sha256) of what a job leaves: the regular files under run/, and
    its log, metrics and result; names are relative to the job folder."""
    folder = Path(folder)
    found = []
    candidates = []
    run = folder / RUN
    if run.is_dir() and not run.is_symlink():
        candidates += list(_regular_files(run, folder))
    for name in TOP_ARTIFACTS:
        try:
            info = os.lstat(folder / name)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            candidates.append((name, info))
    for name, _ in candidates:
        try:
            with open_artifact(folder, name) as handle:
                size = os.fstat(handle.fileno()).st_size
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
        except FileNotFoundError:  # gone, or swapped for a link, since it was listed
            continue
        found.append((name, size, digest))
    return found


def _artifact_parts(name: str) -> list[str]:
    if not isinstance(name, str) or "\x00" in name or "\\" in name or name.startswith("/"):
        raise FileNotFoundError(name)
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise FileNotFoundError(name)
    if not (parts[0] == RUN and len(parts) > 1) and not (len(parts) == 1 and name in TOP_ARTIFACTS):
        raise FileNotFoundError(name)
    return parts


def open_artifact(folder: str | Path, name: str) -> BinaryIO:
    """Open a listed artifact for reading: every component of `name` opened with O_NOFOLLOW
    beneath the job folder, and the file a regular one; otherwise FileNotFoundError."""
    parts = _artifact_parts(name)
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(folder, flags_dir)
    except OSError:
        raise FileNotFoundError(name) from None
    try:
        for part in parts[:-1]:
            inner = os.open(part, flags_dir, dir_fd=fd)
            os.close(fd)
            fd = inner
        # O_NONBLOCK: a fifo planted under the artifact's name must not block the open.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        inner = os.open(parts[-1], flags, dir_fd=fd)
    except OSError:
        raise FileNotFoundError(name) from None
    finally:
        os.close(fd)
    _plain(inner, name)
    return os.fdopen(inner, "rb")


def tail(path: str | Path, offset: int) -> tuple[list[tuple[int, str]], int]:
    """The complete lines of `path` from byte `offset`: [(offset after the line, line)] and the
    offset to read from next; a last line still being written waits for its newline."""
    try:
        with open_plain(path) as handle:
            handle.seek(offset)
            chunk = handle.read(TAIL_CHUNK_BYTES)
    except FileNotFoundError:
        return [], offset
    lines = []
    start = 0
    while (end := chunk.find(b"\n", start)) != -1:
        lines.append((offset + end + 1, chunk[start:end].decode(errors="replace").rstrip("\r")))
        start = end + 1
    if not lines and len(chunk) == TAIL_CHUNK_BYTES:  # one huge line: send it in pieces
        lines.append((offset + len(chunk), chunk.decode(errors="replace")))
        start = len(chunk)
    return lines, offset + start
