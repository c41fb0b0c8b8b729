"""Shard indexes kept on disk, so each shard's tar headers are read once, not in every process.

Indexing a shard reads every tar header (~10-70 µs a sample): over a minute for a million
samples, in the parent (twice) and again in every trainer and Ray worker. The index of shard
`P` is kept in `$DLSCALE_HOME/cache/shards/` as a small .npy named after `P`'s real path,
size and modification time: a shard rewritten in place gets a new entry, and the old one is
never read again. The cache is only ever an optimisation: an entry that cannot be read or does
not fit its shard is ignored (and rewritten), and a cache folder that cannot be written leaves
every open scanning as before, never an error.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np

from dlscale.atomic import temp_beside
from dlscale.data.tar_index import BLOCK_BYTES
from dlscale.home import dlscale_home

# Part of every entry's name: a change to what an index holds (or means) makes new names,
# so an older dlscale's entries are never misread.
FORMAT = "shard-index-v1"
_log = logging.getLogger(__name__)


def cache_folder() -> Path:
    return dlscale_home() / "cache" / "shards"


def entry_path(shard: str, stat: os.stat_result) -> Path:
    """The cache file of a shard as it is now (its real path, size and mtime_ns)."""
    key = f"{FORMAT}\0{os.path.realpath(shard)}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return cache_folder() / f"{hashlib.sha256(key.encode()).hexdigest()}.npy"


def load(shard: str, stat: os.stat_result) -> np.ndarray | None:
    """The cached `ShardIndex.starts` of a shard (sample starts, then its end offset); None
    when there is no entry, or it is unreadable or does not fit the shard."""
    path = entry_path(shard, stat)
    try:
        stored = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError) as error:  # cut short, overwritten, not an .npy
        _log.debug("shard index cache %s unreadable (%s): scanning %s", path, error, shard)
        return None
    starts = _fitting(stored, stat.st_size)
    if starts is None:
        _log.debug("shard index cache %s does not fit %s: scanning it", path, shard)
    return starts


def _fitting(stored: np.ndarray, size: int) -> np.ndarray | None:
    """An entry is [samples, shard bytes, starts..., end]: the starts when all of it agrees."""
    if stored.dtype != np.int64 or stored.ndim != 1 or len(stored) < 3:
        return None
    count, stored_size, starts = int(stored[0]), int(stored[1]), stored[2:]
    if count != len(starts) - 1 or stored_size != size:
        return None
    # Offsets are in the file, in order, on tar's blocks.
    if starts[0] < 0 or starts[-1] > size or np.any(np.diff(starts) <= 0):
        return None
    if np.any(starts % BLOCK_BYTES):
        return None
    return starts.copy()


def save(shard: str, stat: os.stat_result, starts: np.ndarray) -> None:
    """Keep a shard's index for the next open; a folder that cannot be written (a read-only
    home, a full disk) only costs the next open a scan."""
    path = entry_path(shard, stat)
    stored = np.concatenate([[len(starts) - 1, stat.st_size], starts]).astype(np.int64)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with temp_beside(path) as (handle, temp):
            np.save(handle, stored, allow_pickle=False)
            handle.flush()
            # No fsync: an entry lost or cut short by a crash is ignored on load and rewritten.
            os.replace(temp, path)  # concurrent writers of one entry write the same bytes
    except OSError as error:
        _log.debug("shard index cache %s not written (%s)", path, error)
