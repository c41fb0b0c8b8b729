"""WebDataset tar shards on disk: their patterns, where each sample starts, a sample's fields.

A shard is an uncompressed tar whose members are named `{key}.{field}`: the key is the member
name up to the first dot of its base name (WebDataset's convention), and a sample is a run of
consecutive members with one key. Indexing a shard reads only its tar headers, seeking over
the data, and keeps one int64 offset per sample; reading a sample is then one seek and one read.
The index is read from headers once per shard version and then from `shard_cache`.
"""

from __future__ import annotations

import glob
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from braceexpand import braceexpand

from dlscale.data import shard_cache
from dlscale.data.lazy import DataError
from dlscale.data.tar_index import BLOCK_BYTES, sample_members, sample_starts, split_name
from dlscale.errors import one_line, os_reason

EXPECTED = "an uncompressed tar of samples named {key}.{field} (a WebDataset shard)"


def expand_pattern(pattern: str) -> list[str]:
    """The shard files a pattern names, in the order it names them.

    Brace ranges (`train-{000000..000099}.tar`) are expanded as written and must all exist;
    a glob (`shards/*.tar`) contributes its matches, sorted.
    """
    listed: list[str] = []
    for part in braceexpand(pattern):
        listed += sorted(glob.glob(part)) if glob.has_magic(part) else [part]
    present = [path for path in listed if os.path.isfile(path)]
    if not present:
        raise DataError(f"{pattern}: no shard matches this pattern (expected {EXPECTED})")
    if len(present) < len(listed):
        missing = [path for path in listed if not os.path.isfile(path)]
        raise DataError(
            f"{missing[0]}: shard not found ({len(missing)} of the {len(listed)} shards "
            f"that {pattern} lists are missing)"
        )
    return listed


@dataclass(frozen=True)
class ShardIndex:
    """Where each sample of one shard starts: `starts[i]` is the byte offset of sample i's
    first header, `starts[-1]` where the last sample ends."""

    path: str
    starts: np.ndarray  # (samples + 1,) int64

    @property
    def count(self) -> int:
        return len(self.starts) - 1

    def span(self, index: int) -> tuple[int, int]:
        return int(self.starts[index]), int(self.starts[index + 1])


def scan_shard(path: str, listed: dict | None = None) -> ShardIndex:
    """Index one shard: from the shard index cache (`shard_cache`) when it holds the shard as
    it is now, else from its headers. A truncated or corrupt tar is one line naming it;
    `listed` (its dataset.json entry, when there is one) must agree on size and sample count."""
    stat = os.stat(path)
    starts = shard_cache.load(path, stat)
    if starts is None:
        starts = _read_headers(path, stat.st_size)
        if _same_file(os.stat(path), stat):  # not an index of a shard rewritten meanwhile
            shard_cache.save(path, stat, starts)
    index = ShardIndex(path, starts)
    if listed is not None:
        _check_listed(index, stat.st_size, listed)
    elif int(starts[-1]) >= stat.st_size:  # cached or not: nothing follows the last member
        raise DataError(
            f"{path}: truncated tar? It ends with its last member, at byte {stat.st_size}, with "
            "no end-of-archive block after it: cut short where a member ends (copy the shard "
            "again), or written by a tool that leaves the end blocks out (append 1024 zero "
            "bytes to it, or list it in a dataset.json, to read it as it is)"
        )
    return index


def _same_file(now: os.stat_result, before: os.stat_result) -> bool:
    return (now.st_size, now.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _read_headers(path: str, size: int) -> np.ndarray:
    """A shard's `ShardIndex.starts`, read from its tar headers."""
    try:
        starts, end = sample_starts(path)
        with open(path, "rb") as file:  # tarfile stops quietly at a header cut short
            file.seek(end)
            rest = file.read(2 * BLOCK_BYTES)
    except tarfile.ReadError as error:
        if "unexpected end of data" in str(error):
            raise DataError(
                f"{path}: truncated tar: its last member ends past the file's "
                f"{size} bytes (copy the shard again)"
            ) from None
        detail = one_line(error)
        raise DataError(f"{path}: not a readable tar ({detail}); expected {EXPECTED}") from None
    except OSError as error:
        raise DataError(f"{path}: cannot read: {os_reason(error)}") from None
    if size % BLOCK_BYTES or rest.strip(b"\0"):
        raise DataError(
            f"{path}: truncated or corrupt tar: no valid header at byte {end} "
            f"of {size} (copy the shard again)"
        )
    return np.array([*starts, end], dtype=np.int64)


def _check_listed(index: ShardIndex, size: int, listed: dict) -> None:
    """A shard that differs from what convert wrote: cut short at a block boundary, or replaced."""
    if "bytes" in listed and listed["bytes"] != size:
        raise DataError(
            f"{index.path}: {size} bytes, but dataset.json lists {listed['bytes']} "
            "(truncated or replaced: copy the shard again)"
        )
    if "samples" in listed and listed["samples"] != index.count:
        raise DataError(
            f"{index.path}: holds {index.count} samples, but dataset.json lists "
            f"{listed['samples']} (truncated or replaced: copy the shard again)"
        )


def read_manifest(first_shard: str) -> dict | None:
    """The `dataset.json` next to the shards (written by `dlscale data convert`), if any."""
    path = Path(first_shard).parent / "dataset.json"
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: not readable JSON ({one_line(error)})") from None
    if not isinstance(manifest, dict):
        raise DataError(f"{path}: expected a JSON object with task, num_classes and shards")
    return manifest


def listed_shards(manifest: dict | None) -> dict[str, dict]:
    """dataset.json's shard entries by file name."""
    shards = (manifest or {}).get("shards") or []
    return {entry["file"]: entry for entry in shards if isinstance(entry, dict) and "file" in entry}


def sample_fields(chunk: bytes) -> tuple[str, dict[str, bytes]]:
    """(key, {field: bytes}) of one sample's bytes as read from its shard."""
    members = sample_members(chunk)  # the plain headers, ~10x faster than tarfile
    if members is None:
        with tarfile.open(fileobj=io.BytesIO(chunk), mode="r:") as tar:
            members = [
                (m.name, chunk[m.offset_data : m.offset_data + m.size]) for m in tar if m.isfile()
            ]
    fields: dict[str, bytes] = {}
    key = ""
    for name, data in members:
        name_key, field = split_name(name)
        if name_key is None:
            continue
        key = key or name_key
        fields[field] = data
    return key, fields
