"""Small data files sent with a spec: plain files, or one zip unpacked member by member.

Names come from the client, so each one is checked before anything is written: a zip member
that is absolute, climbs out with `..`, is a symlink, holds a NUL or a backslash, or expands
past the upload limit (a zip bomb) refuses the whole upload; nothing is extracted by path
concatenation without these checks (the zip-slip class of bug).
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from dlscale.errors import UserError

MAX_FILES = 10_000
_BAD = ("\x00", "\\", ":")


def check_name(name: str, what: str = "upload") -> PurePosixPath:
    """A relative path of plain names (a/b/c.png), or a UserError naming the problem."""
    if not name or any(ch in name for ch in _BAD) or name.startswith("/"):
        raise UserError(f"{what}: '{name}' is not a plain relative file name")
    path = PurePosixPath(name)
    if any(part in ("", ".", "..") or part.startswith(".") for part in path.parts):
        raise UserError(f"{what}: '{name}' may not contain '..', '.' or hidden names")
    return path


def unpack_zip(archive: Path, into: Path, max_bytes: int) -> list[str]:
    """Extract `archive` under `into` after checking every member; returns the names."""
    try:
        with zipfile.ZipFile(archive) as zipped:
            members = zipped.infolist()
            if len(members) > MAX_FILES:
                raise UserError(f"archive: {len(members)} members; at most {MAX_FILES}")
            total = 0
            for member in members:
                check_name(member.filename.rstrip("/"), "archive member")
                mode = member.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise UserError(f"archive member '{member.filename}' is a symbolic link")
                total += member.file_size
                if total > max_bytes:
                    raise UserError(f"archive: unpacks to more than {max_bytes} bytes")
            names = []
            for member in members:
                target = into / member.filename
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                written = 0
                with zipped.open(member) as source, open(target, "xb") as sink:
                    while chunk := source.read(1 << 20):
                        written += len(chunk)
                        if written > member.file_size:  # the header lied about the size
                            raise UserError(
                                f"archive member '{member.filename}' is larger than stated"
                            )
                        sink.write(chunk)
                names.append(member.filename)
            return names
    except zipfile.BadZipFile as exc:
        raise UserError(f"archive: not a zip file ({exc})") from None
    except (RuntimeError, NotImplementedError, EOFError, zlib.error) as exc:  # encrypted, ...
        raise UserError(f"archive: cannot be unpacked ({type(exc).__name__}: {exc})") from None
    except FileExistsError as exc:
        raise UserError(f"archive: '{Path(exc.filename).name}' is given twice") from None


def copy_inputs(source: Path, target: Path) -> None:
    """A job's inputs copied for a rerun: its folders and regular files, nothing else (a link,
    a fifo or a device in their place is left behind; none is ever followed)."""
    if not source.is_dir() or source.is_symlink():
        return
    for here, dirs, files in os.walk(source):
        into = target / os.path.relpath(here, source)
        into.mkdir(mode=0o700, parents=True, exist_ok=True)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(here, d))]
        for name in files:
            path = os.path.join(here, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                with open(path, "rb") as src, open(into / name, "xb") as dst:
                    shutil.copyfileobj(src, dst)
