"""Staging: copy a data set's files to local disk once per node, resumably, verified by sha256.

Reading shards from slow shared storage while training starves the accelerator, and every
trainer reading the same files adds contention; copying them to a local disk first pays the
slow read once. `stage()` is safe to call from every trainer of a run: the processes serialize
on a lock in the destination, the first copies, the others find the ledger and check sizes.

The ledger (`LEDGER` in the destination) records each staged file: the source's size and mtime
(a source that changed is copied again), the copy's sha256, size, mtime and ctime, and the
seconds the copy took. A copy in progress is `NAME.part`: an interrupted stage continues from its
size.

A copy is reused without reading it while its size, mtime and ctime are the ledger's: any write
to it moves its ctime, which (unlike its mtime) no user can set back, so a bit flipped by a
write is hashed and caught. Bytes decayed on the disk itself are not; `rehash=True` (what
`dlscale data stage` does) reads every copy again, at the local disk's read rate.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dlscale.atomic import write_json_atomic
from dlscale.errors import UserError, os_reason

LEDGER = ".dlscale-staged.json"
LOCK = ".dlscale-stage.lock"
PART_SUFFIX = ".part"
STAGING_FILES = (LEDGER, LOCK)  # never data: skipped when a folder is listed for staging
COPY_CHUNK_BYTES = 8 * 2**20  # large sequential reads suit network file systems


def stage(
    files: list[Path],
    src_root: Path,
    dst_dir: Path,
    rehash: bool = False,
    sources: list[Path] | None = None,
    run: str | None = None,
) -> dict:
    """Copy `files` (all under `src_root`) into `dst_dir`, keeping their layout below the root;
    the copies already there are checked by their ledger entry (`rehash`: by their bytes).
    `dst_dir` must lie outside each of the data set's `sources` folders (by default the root:
    train and validation folders in separate trees have a common root that may hold it).

    Each copy is verified by sha256: against the `dataset.json` beside the file when it lists
    the file, else against the source's own bytes hashed while copying. Returns the run record:
    {"dir", "files", "bytes", "copied_files", "copied_bytes", "seconds" (this call), "staged_s"
    (the copies' own recorded seconds, whichever process made them), "verified"}. With `run`
    (a training run's claim of its folder, `ownership.claim_token`: every process of the run
    stages, one at a time), each copy is tagged with it, and the copied counts are the run's,
    whichever of its processes copied; without, this call's.
    """
    started = time.perf_counter()
    src_root, dst_dir = Path(src_root), Path(dst_dir)
    check_outside(sources or [src_root], dst_dir)
    sources = {str(Path(f).relative_to(src_root)): Path(f) for f in files}
    sizes = {rel: _source_stat(path).st_size for rel, path in sources.items()}
    expected = expected_hashes(list(sources.values()))
    copied_files = copied_bytes = 0
    try:
        dst_dir.mkdir(parents=True, exist_ok=True)
        with _locked(dst_dir):
            ledger = read_ledger(dst_dir)
            for rel, path in sources.items():
                if _still_staged(ledger.get(rel), path, dst_dir / rel, rehash):
                    if _remember_times(ledger[rel], dst_dir / rel):
                        _write_ledger(dst_dir, ledger)  # hashed now: not again until it changes
                    continue
                entry, written = copy_verified(path, dst_dir / rel, expected.get(path))
                ledger[rel] = {**entry, "written": written, **({"run": run} if run else {})}
                _write_ledger(dst_dir, ledger)  # after each file: an interrupted stage resumes
                copied_files += 1
                copied_bytes += written
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        raise UserError(f"cannot stage into {dst_dir}{where}: {os_reason(exc)}") from None
    if run is not None:  # the run's copies, this process's or another's of the same run
        ours = [ledger[rel] for rel in sources if ledger[rel].get("run") == run]
        copied_files = len(ours)
        copied_bytes = sum(entry.get("written", entry["size"]) for entry in ours)
    return {
        "dir": str(dst_dir),
        "files": len(sources),
        "bytes": sum(sizes.values()),
        "copied_files": copied_files,
        "copied_bytes": copied_bytes,
        "seconds": time.perf_counter() - started,
        "staged_s": sum(ledger[rel]["seconds"] for rel in sources),
        "verified": "sha256",
    }


def copy_verified(src: Path, dst: Path, expected: str | None) -> tuple[dict, int]:
    """Copy src to dst through `dst.part` (continued from its size when present), check the
    sha256, then rename into place. Returns the ledger entry and the bytes written now."""
    part = dst.with_name(dst.name + PART_SUFFIX)
    dst.parent.mkdir(parents=True, exist_ok=True)
    source = src.stat()
    offset = part.stat().st_size if part.exists() else 0
    if offset > source.st_size:  # a leftover of another version of the file
        offset = 0
    started = time.perf_counter()
    copy_hash = _hash_prefix(part, offset)
    if expected is None and offset:
        # Without a listed hash, a resumed copy's first bytes are checked against the source's
        # (read again, not written); the bytes copied now are hashed once, as they are written.
        _check_digest(
            src,
            part,
            copy_hash.hexdigest(),
            _hash_prefix(src, offset).hexdigest(),
            "the source has",
        )
    with open(src, "rb") as reader, open(part, "ab" if offset else "wb") as writer:
        reader.seek(offset)
        while chunk := reader.read(COPY_CHUNK_BYTES):
            writer.write(chunk)
            copy_hash.update(chunk)
        writer.flush()
        os.fsync(writer.fileno())
    digest = copy_hash.hexdigest()
    if expected is not None:
        _check_digest(src, part, digest, expected, "dataset.json lists")
    os.replace(part, dst)
    copied = dst.stat()
    entry = {
        "size": source.st_size,
        "mtime_ns": source.st_mtime_ns,
        "sha256": digest,
        "staged_mtime_ns": copied.st_mtime_ns,
        "staged_ctime_ns": copied.st_ctime_ns,
        "seconds": time.perf_counter() - started,
    }
    return entry, source.st_size - offset


def _check_digest(src: Path, part: Path, digest: str, want: str, against: str) -> None:
    """One line, and the copy removed, when the copy's sha256 is not the one it should be."""
    if digest != want:
        part.unlink()
        raise UserError(
            f"{src}: the staged copy's sha256 {digest[:12]}… differs from the {want[:12]}… "
            f"{against}; the copy was removed (is the file corrupt, or changed since?)"
        )


def expected_hashes(files: list[Path]) -> dict[Path, str]:
    """The sha256 that the `dataset.json` beside each file lists for it (convert writes them)."""
    found: dict[Path, str] = {}
    for folder in sorted({Path(f).parent for f in files}):
        listing = folder / "dataset.json"
        if not listing.is_file():
            continue
        try:
            shards = json.loads(listing.read_text())["shards"]
            found.update({folder / s["file"]: s["sha256"] for s in shards if "sha256" in s})
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(
                f"{listing}: not a dataset.json with a list of shards ({type(exc).__name__})"
            ) from None
    return found


def read_ledger(dst_dir: Path) -> dict[str, dict]:
    """What has been staged into dst_dir: relative path → ledger entry (empty when nothing)."""
    path = Path(dst_dir) / LEDGER
    try:
        return json.loads(path.read_text())["files"]
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError):
        # A damaged ledger costs a fresh copy, never a wrong one: every file is copied again.
        return {}


def check_outside(folders: list[Path], dst_dir: Path) -> None:
    """One line when the destination is one of the data set's folders or inside one: the copies
    would land on the storage they are meant to spare, and join the data set's own files."""
    dst = Path(dst_dir).resolve()
    for folder in folders:
        if dst.is_relative_to(Path(folder).resolve()):
            raise UserError(
                f"{dst_dir} is inside the data set it copies ({folder}): stage into a folder "
                "outside it, on the local disk"
            )


def _still_staged(entry: dict | None, src: Path, dst: Path, rehash: bool) -> bool:
    """Whether dst is the verified copy of src's current version: by its size and times
    (see the module docstring), else, or with `rehash`, by its bytes hashed again."""
    if entry is None or not dst.is_file():
        return False
    source = src.stat()
    if (source.st_size, source.st_mtime_ns) != (entry["size"], entry["mtime_ns"]):
        return False  # the source changed since: stage the new version
    copy = dst.stat()
    seen = (copy.st_size, copy.st_mtime_ns, copy.st_ctime_ns)
    recorded = (entry["size"], entry["staged_mtime_ns"], entry.get("staged_ctime_ns"))
    if seen == recorded and not rehash:
        return True
    with open(dst, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    if digest != entry["sha256"]:
        dst.unlink()
        raise UserError(
            f"{dst}: the staged copy changed after staging (sha256 {digest[:12]}… instead of "
            f"{entry['sha256'][:12]}…); it was removed: stage again to copy {src} anew"
        )
    return True


def _remember_times(entry: dict, dst: Path) -> bool:
    """Put a verified copy's current times in its ledger entry; whether they were new."""
    copy = dst.stat()
    times = {"staged_mtime_ns": copy.st_mtime_ns, "staged_ctime_ns": copy.st_ctime_ns}
    changed = any(entry.get(key) != value for key, value in times.items())
    entry.update(times)
    return changed


def _hash_prefix(path: Path, size: int):
    """sha256 of the first `size` bytes of `path`, to continue with the rest."""
    digest = hashlib.sha256()
    if size:
        with open(path, "rb") as handle:
            remaining = size
            while remaining and (chunk := handle.read(min(COPY_CHUNK_BYTES, remaining))):
                digest.update(chunk)
                remaining -= len(chunk)
    return digest


def _source_stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except OSError as exc:
        raise UserError(f"{path}: cannot stage it: {os_reason(exc)}") from None


def _write_ledger(dst_dir: Path, files: dict[str, dict]) -> None:
    """Write beside, then rename: a reader sees the old ledger or the new one, never half."""
    write_json_atomic(dst_dir / LEDGER, {"files": files}, shared=True)


@contextmanager
def _locked(dst_dir: Path) -> Iterator[None]:
    """Hold dst_dir's stage lock: one process copies while the others wait for its ledger."""
    with open(dst_dir / LOCK, "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
