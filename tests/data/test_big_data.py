"""Larger than memory, measured: an epoch over about 1.6 GB of shards holds no more memory than
an epoch over a tenth of them; and a parallel run reads each sample once, in its own trainer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dlscale.api.data import convert_data

SHAPE = [3, 128, 128]  # 49,152 bytes a sample as uint8
# ≈ 1.6 GB of shards. The size follows from the bounds checked: twice the peak of a run
# (≈ 560-610 MiB: torch, the shuffle buffer, a batch) must stay under the data with room to spare,
# and memory that grew with the data would grow by ~1.3 GiB, ten times the 128 MiB allowed.
BIG_SAMPLES = 31_000
SMALL_SAMPLES = BIG_SAMPLES // 10


def convert(out: Path, samples: int) -> dict:
    return convert_data(
        "synthetic", out, shard_size="256MB", samples=samples, shape=SHAPE, classes=10, seed=0
    )


def start_training(shards: Path, tmp_path: Path, name: str) -> tuple:
    """One epoch by `dlscale train` in a process of its own, so its peak resident memory is the
    run's alone (the record's peak_memory_bytes on a CPU is the process's own VmHWM)."""
    spec = {
        "name": name,
        "model": {"name": "mlp", "kwargs": {"hidden": [16]}},
        "data": {
            "name": "webdataset",
            "urls": str(shards / "train-*.tar"),
            "val_urls": str(shards / "val-*.tar"),
            "shuffle_buffer": 500,
        },
        "batch_size": 256,
        "epochs": 1,
        "device": "cpu",
        "optimizer": {"name": "sgd", "lr": 0.01},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / f"run-{name}"
    command = [sys.executable, "-m", "dlscale.cli.main", "train", str(path), "--out", str(out)]
    errors = tmp_path / f"{name}.stderr"  # a file, not a pipe: nobody reads it while it runs
    with errors.open("w") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    return process, out, errors


def finish_training(started: tuple) -> dict:
    """The record of a run `start_training` started, once it ends."""
    process, out, errors = started
    process.wait(timeout=900)
    assert process.returncode == 0, errors.read_text()[-2000:]
    return json.loads((out / "run.json").read_text())


@pytest.mark.slow
@pytest.mark.heavy
def test_peak_memory_does_not_grow_with_the_size_of_the_data(tmp_path: Path):
    convert(tmp_path / "small", SMALL_SAMPLES)
    # The small run trains while the big set is written: each run's peak is its own process's.
    small = start_training(tmp_path / "small", tmp_path, "small")
    try:
        big = convert(tmp_path / "big", BIG_SAMPLES)
    finally:
        records = {"small": finish_training(small)}
    big_bytes = big["bytes"]
    assert big_bytes > 1.5e9
    records["big"] = finish_training(start_training(tmp_path / "big", tmp_path, "big"))
    peak = {name: r["workers"][0]["peak_memory_bytes"] for name, r in records.items()}
    read = {name: r["timing"]["read_bytes"] for name, r in records.items()}
    print(
        f"peak RSS small {peak['small'] / 2**20:.0f} MiB, big {peak['big'] / 2**20:.0f} MiB; "
        f"read {read['small'] / 1e9:.2f} / {read['big'] / 1e9:.2f} GB"
    )
    # Every training sample of the epoch was read (the partial last batch excepted) ...
    assert read["big"] > 0.75 * big_bytes
    assert records["big"]["data"]["train_samples"] > 9 * records["small"]["data"]["train_samples"]
    # ... and ten times the data took no more memory: well under the 1.3 GB more it read.
    assert peak["big"] - peak["small"] < 128 * 2**20
    assert peak["big"] < big_bytes / 2
