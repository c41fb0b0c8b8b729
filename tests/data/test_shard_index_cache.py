"""The shard index cache: a data set's tar headers are read once per shard version, under
$DLSCALE_HOME; a stale, corrupt or unwritable cache only costs a scan, never an error."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest
import webdataset

from dlscale.data import shards as shards_module
from dlscale.data.lazy import DataError
from tests.data.test_webdataset import PER_SHARD, open_data, sample, write_shards


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "home"
    monkeypatch.setenv("DLSCALE_HOME", str(folder))
    return folder


@pytest.fixture
def scans(monkeypatch) -> list[str]:
    """The shards whose tar headers were read, one entry per read."""
    seen: list[str] = []
    real = shards_module.sample_starts

    def counting(path):
        seen.append(os.path.basename(path))
        return real(path)

    monkeypatch.setattr(shards_module, "sample_starts", counting)
    return seen


def entries(home: Path) -> list[Path]:
    return sorted((home / "cache" / "shards").glob("*.npy"))


def first_batch(data) -> list:
    x, y, _ = next(iter(data.train.batches(0, 0, 8)))
    return [x.tolist(), y.tolist()]


def test_a_second_open_reads_no_tar_header(home, scans, tmp_path):
    urls = write_shards(tmp_path / "wds", shards=3)
    first = open_data(urls)
    assert sorted(scans) == [f"train-{s:06d}.tar" for s in range(3)]
    assert len(entries(home)) == 3  # under $DLSCALE_HOME, one small file a shard
    scans.clear()
    again = open_data(urls)
    assert scans == []
    assert (len(again.train), len(again.val)) == (len(first.train), len(first.val))
    assert first_batch(again) == first_batch(first)


def test_each_dlscale_home_has_its_own_cache(home, scans, tmp_path, monkeypatch):
    urls = write_shards(tmp_path / "wds", shards=2)
    open_data(urls)
    monkeypatch.setenv("DLSCALE_HOME", str(tmp_path / "other"))
    scans.clear()
    open_data(urls)
    assert len(scans) == 2 and len(entries(tmp_path / "other")) == 2


def test_a_shard_rewritten_in_place_is_scanned_again(home, scans, tmp_path):
    urls = write_shards(tmp_path / "wds", shards=2)
    assert len(open_data(urls).train) + len(open_data(urls).val) == 2 * PER_SHARD
    # Shard 1 rewritten with fewer samples (a new size), shard 0 touched (same size, new time).
    with webdataset.TarWriter(str(tmp_path / "wds" / "train-000001.tar")) as writer:
        for n in range(PER_SHARD, PER_SHARD + 10):
            writer.write(sample(n))
    shard0 = tmp_path / "wds" / "train-000000.tar"
    stat = shard0.stat()
    os.utime(shard0, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    scans.clear()
    data = open_data(urls)
    assert sorted(scans) == ["train-000000.tar", "train-000001.tar"]
    assert len(data.train) + len(data.val) == PER_SHARD + 10


CORRUPTIONS = {
    "not an npy file": lambda path: path.write_bytes(b"not an index at all\n"),
    "cut short": lambda path: path.write_bytes(path.read_bytes()[:-12]),
    "empty": lambda path: path.write_bytes(b""),
    "a pickle": lambda path: np.save(path, np.array([{"x": 1}], dtype=object)),
    "a count that does not fit": lambda path: np.save(
        path, np.array([PER_SHARD + 1, *np.load(path)[1:]], dtype=np.int64)
    ),
    "an end past the shard's size": lambda path: np.save(
        path, np.array([*np.load(path)[:-1], 10**12], dtype=np.int64)
    ),
    "another shard's size": lambda path: np.save(
        path, np.array([PER_SHARD, 512, *np.load(path)[2:]], dtype=np.int64)
    ),
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupt_cache_entry_is_ignored_and_rewritten(home, scans, tmp_path, corruption):
    urls = write_shards(tmp_path / "wds", shards=2)
    expected = first_batch(open_data(urls))
    for entry in entries(home):
        CORRUPTIONS[corruption](entry)
    scans.clear()
    assert first_batch(open_data(urls)) == expected
    assert len(scans) == 2
    scans.clear()
    open_data(urls)
    assert scans == []  # rewritten by the open that ignored it


@pytest.mark.parametrize("blocked", ["a read-only folder", "a file where the folder goes"])
def test_an_unwritable_cache_still_opens_the_data(home, scans, tmp_path, blocked, caplog):
    urls = write_shards(tmp_path / "wds", shards=2)
    folder = home / "cache" / "shards"
    folder.parent.mkdir(parents=True)
    if blocked == "a read-only folder":
        folder.mkdir(mode=0o500)
        probe = folder / "probe"
        try:  # root writes through 0o500: block writes the other way then
            probe.write_bytes(b"")
        except PermissionError:
            pass
        else:
            probe.unlink()
            folder.rmdir()
            folder.write_bytes(b"")
    else:
        folder.write_bytes(b"")
    expected = first_batch(open_data(urls))
    caplog.set_level(logging.DEBUG)
    scans.clear()
    assert first_batch(open_data(urls)) == expected
    assert len(scans) == 2  # each open scans, as before the cache
    assert not [r for r in caplog.records if r.levelno > logging.DEBUG]
    folder.chmod(0o700)  # let tmp_path be removed
    assert not (folder.is_dir() and list(folder.iterdir()))


def test_dataset_json_still_checks_a_cached_index(home, scans, tmp_path):
    urls = write_shards(tmp_path / "wds", shards=2)
    listing = [
        {"file": f"train-{s:06d}.tar", "split": "train", "samples": PER_SHARD} for s in range(2)
    ]
    manifest = tmp_path / "wds" / "dataset.json"
    manifest.write_text(json.dumps({"shards": listing}))
    open_data(urls)
    listing[1]["samples"] = PER_SHARD + 1
    manifest.write_text(json.dumps({"shards": listing}))
    scans.clear()
    with pytest.raises(DataError, match=r"train-000001\.tar: holds 50 samples, but dataset\.json"):
        open_data(urls)
    assert scans == []
