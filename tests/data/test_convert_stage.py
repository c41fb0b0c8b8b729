"""`dlscale data convert` and staging: shards that round-trip, bounded memory, verified copies."""

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dlscale import api
from dlscale.api.data import convert_data, stage_data
from dlscale.cli.main import app
from dlscale.data import build_data
from dlscale.data.dataset_files import stage_spec
from dlscale.data.generate import synthetic_image_chunks
from dlscale.data.stage import LEDGER, stage
from dlscale.errors import UserError
from dlscale.jobspec import DigitsData, HfData, ImagesData, WebDatasetData, load_spec

runner = CliRunner()


def cli(*args):
    return runner.invoke(app, [str(a) for a in args])


def read_shard(path: Path) -> list[dict[str, bytes]]:
    """A shard's samples as {field: bytes}, grouped by key in member order."""
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            key, field = member.name.split(".", 1)
            samples.setdefault(key, {})[field] = tar.extractfile(member).read()
    return list(samples.values())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """600 synthetic 3×8×8 images in shards of 20 KB (a dozen or more of them)."""
    out = tmp_path_factory.mktemp("convert") / "shards"
    result = cli(
        "data",
        "convert",
        "synthetic",
        out,
        "--samples",
        600,
        "--shape",
        "3,8,8",
        "--classes",
        4,
        "--seed",
        7,
        "--shard-size",
        "20KB",
    )
    assert result.exit_code == 0, result.output
    assert "wrote" in result.stdout and "480 training + 120 validation" in result.stdout
    return out


# ------------------------------------------------------------------------------ convert


def test_convert_lists_every_shard_with_its_samples_bytes_and_sha256(shards: Path):
    listing = json.loads((shards / "dataset.json").read_text())
    assert listing["format"] == "webdataset" and listing["input_shape"] == [3, 8, 8]
    assert listing["num_classes"] == 4 and listing["task"] == "classification"
    entries = listing["shards"]
    assert len(entries) >= 3
    assert sorted(p.name for p in shards.glob("*.tar")) == sorted(e["file"] for e in entries)
    for split, count in (("train", 480), ("val", 120)):
        assert sum(e["samples"] for e in entries if e["split"] == split) == count
    for entry in entries:
        path = shards / entry["file"]
        assert entry["bytes"] == path.stat().st_size and entry["sha256"] == sha256(path)
        assert len(read_shard(path)) == entry["samples"]


def test_a_shard_size_below_one_sample_s_shard_is_said(shards: Path, tmp_path: Path):
    """The defect: `--shard-size 1KB` wrote 20 KiB shards of six samples without a word (the
    cut read the file's position, which lags tar's 10 KiB buffer). Now a shard is cut once its
    closed size reaches the size asked; one that a single sample passes holds one sample, and
    the result and the command say so; a size the shards keep to says nothing."""
    small = convert_data(
        "synthetic", tmp_path / "small", shard_size="1KB", samples=12, shape=[3, 8, 8], seed=1
    )
    (warning,) = small["warnings"]
    listing = json.loads((tmp_path / "small" / "dataset.json").read_text())
    assert all(entry["samples"] == 1 for entry in listing["shards"])
    assert {entry["bytes"] for entry in listing["shards"]} == {10240}  # one 10 KiB tar record
    assert warning.startswith("--shard-size 1,000 bytes is less than a shard of one sample")
    assert "12 shards of one sample each" in warning
    kept = convert_data(
        "synthetic", tmp_path / "kept", shard_size="20KB", samples=12, shape=[3, 8, 8], seed=1
    )
    assert kept["warnings"] == []
    kept_listing = json.loads((tmp_path / "kept" / "dataset.json").read_text())["shards"]
    # cut once the closed file would reach 20 KB: two 10 KiB records, several samples each
    train = [entry for entry in kept_listing if entry["split"] == "train"]
    assert len(train) == 2 and train[0]["bytes"] == 20480  # the last of a split holds the rest
    assert all(entry["samples"] > 1 for entry in kept_listing)
    result = cli(
        "data",
        "convert",
        "synthetic",
        tmp_path / "cli",
        "--samples",
        3,
        "--shape",
        "3,8,8",
        "--shard-size",
        "1KB",
    )
    assert result.exit_code == 0, result.output
    assert "warning: --shard-size 1,000 bytes" in " ".join(result.stderr.split())


def test_synthetic_shards_hold_the_seeded_samples_and_are_learnable(shards: Path):
    (_, x, y), *_ = synthetic_image_chunks(600, [3, 8, 8], 4, seed=7)  # one chunk: all 600
    samples = [s for f in sorted(shards.glob("train-*.tar")) for s in read_shard(f)]
    samples += [s for f in sorted(shards.glob("val-*.tar")) for s in read_shard(f)]
    stored = np.stack([np.load(io.BytesIO(s["input.npy"])) for s in samples])
    labels = np.array([int(s["cls"]) for s in samples])
    assert stored.dtype == np.uint8 and np.array_equal(stored, x) and np.array_equal(labels, y)
    # Learnable: the nearest training class mean labels most validation images correctly.
    flat = stored.reshape(600, -1).astype(np.float32)
    means = np.stack([flat[:480][labels[:480] == k].mean(0) for k in range(4)])
    guess = ((flat[480:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (guess == labels[480:]).mean() > 0.9


def test_convert_digits_round_trips_the_readers_samples(tmp_path: Path):
    result = convert_data("digits", tmp_path / "d", shard_size="40KB", seed=3)
    assert result["shards"] >= 3 and result["samples"] == {"train": 1437, "val": 360}
    reference = build_data(DigitsData(name="digits"), 3)
    x, y = reference.train.tensors
    first = read_shard(tmp_path / "d" / "train-000000.tar")
    stored = torch.from_numpy(np.stack([np.load(io.BytesIO(s["input.npy"])) for s in first]))
    assert stored.dtype == torch.uint8 and stored.shape[1:] == (1, 8, 8)
    # Stored as uint8: within half a level of 255 of the reader's floats, in the reader's order.
    assert torch.allclose(stored.float() / 255, x[: len(first)], atol=0.5 / 255 + 1e-6)
    assert [int(s["cls"]) for s in first] == y[: len(first)].tolist()


def test_convert_hf_loads_with_datasets_and_the_hf_reader(tmp_path: Path):
    import datasets

    out = tmp_path / "hf"
    result = convert_data(
        "synthetic",
        out,
        format="hf",
        shard_size="20KB",
        samples=300,
        shape=[3, 8, 8],
        classes=4,
        seed=1,
    )
    assert result["format"] == "hf" and result["shards"] >= 3
    loaded = datasets.load_from_disk(str(out))
    assert len(loaded["train"]) == 240 and len(loaded["validation"]) == 60
    (_, x, y), *_ = synthetic_image_chunks(300, [3, 8, 8], 4, seed=1)
    row = loaded["train"].with_format("numpy")[5]
    assert np.array_equal(row["input"], x[5]) and int(row["label"]) == y[5]
    # A DatasetDict's "validation" split validates unless val_split names another.
    default = HfData(name="hf", path=out, input_column="input")
    for spec in (default, default.model_copy(update={"val_split": "validation"})):
        bundle = build_data(spec, 0)
        assert (len(bundle.train), len(bundle.val)) == (240, 60)
        assert bundle.input_shape == (3, 8, 8)


def test_convert_reads_a_job_specs_data_section(tmp_path: Path):
    tokens = np.random.default_rng(0).integers(0, 50, size=(40, 9))
    np.savez(tmp_path / "text.npz", x=tokens[:, :-1], y=tokens[:, 1:])  # next-token labels
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: t\nmodel: {name: gpt}\ndata: {name: npz, path: text.npz, "
        "val_fraction: 0.25}\nbatch_size: 4\nepochs: 1\n"
    )
    result = cli("data", "convert", spec, tmp_path / "out", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["samples"] == {"train": 30, "val": 10}
    listing = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert listing["task"] == "language_modeling" and listing["vocab_size"] == 50
    bundle = build_data(load_spec(spec).data, 0)
    x, y = bundle.train.tensors
    sample = read_shard(tmp_path / "out" / "train-000000.tar")[0]
    assert np.array_equal(np.load(io.BytesIO(sample["input.npy"])), x[0].numpy())
    assert np.array_equal(np.load(io.BytesIO(sample["target.npy"])), y[0].numpy())
    refused = cli("data", "convert", spec, tmp_path / "o2", "--seed", 1)
    assert refused.exit_code == 2 and "--seed: not for a spec" in refused.output


CONVERT_AND_PEAK = """
import sys
from pathlib import Path
from dlscale.api.data import convert_data
from dlscale.train.device import host_peak_rss_bytes  # this program's, not pytest's before exec
for samples in (800, 8000):
    convert_data("synthetic", Path(sys.argv[1]) / str(samples), shard_size="4MB",
                 samples=samples, shape=[3, 64, 64])
    print(host_peak_rss_bytes())
"""


def test_converting_ten_times_more_samples_does_not_grow_peak_memory(tmp_path: Path):
    """~115 MB of synthetic images (100× the default set) after ~11 MB, in one process: its
    peak resident memory must not follow the data's size."""
    done = subprocess.run(
        [sys.executable, "-c", CONVERT_AND_PEAK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    small_peak, large_peak = (int(line) for line in done.stdout.split()[-2:])
    sizes = [sum(p.stat().st_size for p in (tmp_path / n).glob("*.tar")) for n in ("800", "8000")]
    growth = sizes[1] - sizes[0]
    assert growth > 90e6
    assert large_peak - small_peak < growth / 8, (small_peak, large_peak, sizes)


def test_convert_refuses_a_folder_that_holds_data_and_bad_options(shards: Path, tmp_path: Path):
    before = sha256(shards / "dataset.json")
    result = cli("data", "convert", "digits", shards)
    assert result.exit_code == 2 and "is not empty" in result.output
    assert sha256(shards / "dataset.json") == before
    blocker = tmp_path / "file"
    blocker.write_text("x")
    bad = [
        (["digits", blocker / "out"], f"cannot write the data set into {blocker / 'out'}"),
        (["digits", tmp_path / "a", "--shard-size", "12XB"], "--shard-size"),
        (["digits", tmp_path / "b", "--shard-size", "0"], "--shard-size"),
        (["digits", tmp_path / "c", "--samples", "10"], "--samples: apply to synthetic only"),
        (["synthetic", tmp_path / "d", "--shape", "64", "--image-format", "png"], "not images"),
        (["mnist", tmp_path / "e"], "not a source"),
        (["digits", tmp_path / "f", "--format", "zip"], "--format"),
        (["synthetic", tmp_path / "g", "--seed", "-1"], "--seed: -1 is not between 0 and"),
        (["digits", tmp_path / "h", "--seed", str(2**32)], "--seed: 4294967296 is not between"),
        (["synthetic", tmp_path / "i", "--shape", "100000,100000,100000"], "of memory"),
        (["synthetic", tmp_path / "j", "--shape", "3,10000000000,10000000000"], "of memory"),
    ]
    for args, expected in bad:
        result = cli("data", "convert", *args)
        assert result.exit_code == 2, (args, result.output)
        assert expected in result.output and len(result.output.strip().splitlines()) == 1
        assert "Traceback" not in result.output


def test_an_interrupted_convert_leaves_shards_but_no_dataset_json(tmp_path: Path):
    def interrupt(done: int, total: int) -> None:
        if done >= total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_data(
            "synthetic",
            tmp_path / "o",
            shard_size="20KB",
            samples=4000,
            shape=[8],
            on_progress=interrupt,
        )
    assert (
        list((tmp_path / "o").glob("train-*.tar"))
        and not (tmp_path / "o" / "dataset.json").exists()
    )


# ------------------------------------------------------------------------------ staging


def test_stage_copies_once_and_then_reuses_the_ledger(shards: Path, tmp_path: Path):
    first = stage_data(shards, tmp_path / "local")
    names = sorted(p.name for p in shards.iterdir())
    assert first["files"] == len(names) and first["copied_files"] == len(names)
    assert first["copied_bytes"] == first["bytes"] and first["verified"] == "sha256"
    for name in names:
        assert (tmp_path / "local" / name).read_bytes() == (shards / name).read_bytes()
    again = stage_data(shards, tmp_path / "local")
    assert again["copied_files"] == 0 and again["copied_bytes"] == 0
    assert again["staged_s"] == first["staged_s"]  # the copy's own time, as recorded
    ledger = json.loads((tmp_path / "local" / LEDGER).read_text())["files"]
    assert sorted(ledger) == names


def test_ctrl_c_while_the_ledger_is_written_leaves_no_temp_file(
    shards: Path, tmp_path: Path, monkeypatch
):
    real_fsync = os.fsync

    def interrupted_on_the_ledger(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if LEDGER in name and name.endswith(".tmp"):
            raise KeyboardInterrupt  # Ctrl-C while the ledger's new copy reaches the disk
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", interrupted_on_the_ledger)
    dst = tmp_path / "local"
    with pytest.raises(KeyboardInterrupt):
        stage(sorted(shards.iterdir()), shards, dst)
    assert list(dst.rglob("*.tmp")) == []
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert stage(sorted(shards.iterdir()), shards, dst)["files"] == len(list(shards.iterdir()))


def test_a_half_written_part_is_continued(shards: Path, tmp_path: Path):
    source = shards / "train-000000.tar"
    dst = tmp_path / "local"
    dst.mkdir()
    half = source.stat().st_size // 2
    (dst / "train-000000.tar.part").write_bytes(source.read_bytes()[:half])
    record = stage([source], shards, dst)
    assert record["copied_files"] == 1 and record["copied_bytes"] == source.stat().st_size - half
    assert (dst / "train-000000.tar").read_bytes() == source.read_bytes()
    assert not (dst / "train-000000.tar.part").exists()


def test_two_stagers_at_once_copy_each_file_once(shards: Path, tmp_path: Path):
    with ThreadPoolExecutor(2) as pool:  # each opens the lock file itself: flock excludes
        records = list(pool.map(lambda _: stage_data(shards, tmp_path / "l"), range(2)))
    assert sum(r["copied_files"] for r in records) == records[0]["files"]
    assert records[0]["staged_s"] == records[1]["staged_s"]


def test_a_staged_copy_changed_later_is_reported_and_removed(shards: Path, tmp_path: Path):
    dst = tmp_path / "local"
    stage_data(shards, dst)
    copy = dst / "train-000001.tar"
    data = bytearray(copy.read_bytes())
    data[700] ^= 0xFF
    copy.write_bytes(bytes(data))
    stat = copy.stat()  # a later change: its time moves on (a write in the same tick may not)
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(UserError, match=r"train-000001.tar: the staged copy changed") as caught:
        stage_data(shards, dst)
    assert "\n" not in str(caught.value) and not copy.exists()
    assert stage_data(shards, dst)["copied_files"] == 1  # staged anew, verified
    assert copy.read_bytes() == (shards / "train-000001.tar").read_bytes()


def test_a_source_that_differs_from_dataset_json_is_not_staged(shards: Path, tmp_path: Path):
    source_dir = tmp_path / "src"
    source_dir.mkdir()
    for path in shards.iterdir():
        (source_dir / path.name).write_bytes(path.read_bytes())
    data = bytearray((source_dir / "val-000000.tar").read_bytes())
    data[1000] ^= 0x01  # dataset.json still lists the old sha256
    (source_dir / "val-000000.tar").write_bytes(bytes(data))
    result = cli("data", "stage", source_dir, tmp_path / "local")
    assert result.exit_code == 2 and "val-000000.tar" in result.output
    assert "dataset.json lists" in result.output and len(result.output.strip().splitlines()) == 1
    assert not list((tmp_path / "local").glob("val-000000.tar*"))


def test_a_resumed_part_is_checked_against_the_source_without_dataset_json(tmp_path: Path):
    source = tmp_path / "src" / "a.bin"
    source.parent.mkdir()
    source.write_bytes(bytes(range(256)) * 100)
    dst = tmp_path / "local"
    dst.mkdir()
    (dst / "a.bin.part").write_bytes(b"\x00" * 1000)  # not the source's first bytes
    with pytest.raises(UserError, match=r"differs from .* the source has"):
        stage([source], source.parent, dst)
    assert not (dst / "a.bin.part").exists() and not (dst / "a.bin").exists()


def test_data_stage_spec_reads_the_staged_copy(shards: Path, tmp_path: Path):
    spec = WebDatasetData(
        name="webdataset",
        urls=str(shards / "train-{000000..000002}.tar"),
        val_urls=str(shards / "val-000000.tar"),
        stage=tmp_path / "local",
    )
    bundle = build_data(spec, 0, stage=True)
    assert bundle.staging["copied_files"] == 5  # 4 shards and dataset.json
    assert all(f.startswith(str(tmp_path / "local")) for f in bundle.train.files())
    listing = json.loads((shards / "dataset.json").read_text())["shards"]
    samples = {e["file"]: e["samples"] for e in listing}
    assert len(bundle.train) == sum(samples[f"train-00000{i}.tar"] for i in range(3))
    assert build_data(spec, 0, stage=True).staging["copied_files"] == 0


def test_every_process_of_a_run_records_the_run_s_copies(shards: Path, tmp_path: Path):
    """The defect: under ddp (or a ps parent that stages before its workers) run.json's staging
    said what the process writing it had copied itself: all of it or none, run to run, by who
    won the stage lock. Copies are tagged with the run (its claim of its folder,
    ownership.claim_token): each of its processes counts the run's copies, whichever made them;
    another run copies nothing and says so."""
    spec = WebDatasetData(
        name="webdataset",
        urls=str(shards / "train-{000000..000002}.tar"),
        val_urls=str(shards / "val-000000.tar"),
        stage=tmp_path / "local",
    )
    run = str(tmp_path / "run")
    first = build_data(spec, 0, stage=True, run=run).staging  # the one that won the lock
    second = build_data(spec, 0, stage=True, run=run).staging  # found them staged
    assert first["copied_files"] == second["copied_files"] == 5  # 4 shards and dataset.json
    assert first["copied_bytes"] == second["copied_bytes"] == first["bytes"]
    later = build_data(spec, 0, stage=True, run=str(tmp_path / "another")).staging
    assert later["copied_files"] == 0 and later["copied_bytes"] == 0


def test_data_stage_cli_reports_and_fails_in_one_line(shards: Path, tmp_path: Path):
    result = cli("data", "stage", str(shards / "train-{000000..000001}.tar"), tmp_path / "l")
    assert result.exit_code == 0, result.output
    assert "staged 3 file(s)" in result.stdout and "verified by sha256" in result.stdout
    as_json = json.loads(cli("data", "stage", shards, tmp_path / "l", "--json").stdout)
    assert as_json["copied_files"] == as_json["files"] - 3
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for args, expected in (
        ([tmp_path / "nowhere", tmp_path / "l2"], "not found"),
        ([str(shards / "train-{000000..000999}.tar"), tmp_path / "l3"], "shard not found"),
        ([shards, blocker / "sub"], f"cannot stage into {blocker / 'sub'}"),
    ):
        result = cli("data", "stage", *args)
        assert result.exit_code == 2 and expected in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("strategy", ["{name: single}", "{name: ps, mode: async, workers: 2}"])
def test_training_with_data_stage_records_the_staging_in_run_json(
    shards: Path, tmp_path: Path, strategy: str
):
    """ps: its parent stages before any worker starts, and worker 0 writes the record: the
    run's copies are counted all the same (they were counted as none)."""
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: staged\nmodel: {name: mlp}\nbatch_size: 8\nsteps: 3\ndevice: cpu\n"
        f"strategy: {strategy}\n"
        f"data: {{name: webdataset, urls: '{shards}/train-{{000000..000003}}.tar', "
        f"val_urls: '{shards}/val-000000.tar', stage: {tmp_path / 'local'}}}\n"
    )
    api.validate(spec)  # trying a spec (its checks included) reads the data where it is
    assert not (tmp_path / "local").exists()
    record = api.train(spec, out_dir=tmp_path / "run")
    staging = json.loads((tmp_path / "run" / "run.json").read_text())["data"]["staging"]
    assert staging == record.data.staging and staging["files"] == 6
    assert staging["copied_files"] == 6 and staging["copied_bytes"] == staging["bytes"]
    if strategy == "{name: single}":  # another run (its own claim of its folder) copies none
        again = api.train(spec, out_dir=tmp_path / "again").data.staging
        assert again["copied_files"] == 0 and again["copied_bytes"] == 0
    assert staging["dir"] == str(tmp_path / "local") and staging["verified"] == "sha256"
    assert staging["staged_s"] > 0 and (tmp_path / "local" / "train-000003.tar").is_file()


def test_an_image_spec_with_a_validation_folder_is_staged_in_its_layout(tmp_path: Path):
    from PIL import Image

    for part in ("train", "val"):
        for label in ("cat", "dog"):
            folder = tmp_path / "photos" / part / label
            folder.mkdir(parents=True)
            for i in range(2):
                Image.new("L", (4, 4), 60 * i).save(folder / f"{i}.png")
    spec = ImagesData(
        name="images",
        path=tmp_path / "photos" / "train",
        val_path=tmp_path / "photos" / "val",
        stage=tmp_path / "local",
    )
    staged, record = stage_spec(spec)
    assert (staged.path, staged.val_path) == (
        tmp_path / "local" / "train",
        tmp_path / "local" / "val",
    )
    assert record["files"] == record["copied_files"] == 8
    assert (staged.val_path / "dog" / "1.png").read_bytes() == (
        tmp_path / "photos" / "val" / "dog" / "1.png"
    ).read_bytes()


def test_a_bit_flip_that_keeps_size_and_mtime_is_caught(shards: Path, tmp_path: Path):
    dst = tmp_path / "local"
    stage(sorted(shards.iterdir()), shards, dst)
    copy = dst / "train-000002.tar"
    stat = copy.stat()
    data = bytearray(copy.read_bytes())
    data[900] ^= 0x04
    copy.write_bytes(bytes(data))
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same time
    with pytest.raises(UserError, match=r"train-000002.tar: the staged copy changed"):
        stage(sorted(shards.iterdir()), shards, dst)
    assert not copy.exists()


def test_data_stage_rehashes_every_copy_it_reuses(shards: Path, tmp_path: Path):
    dst = tmp_path / "local"
    stage_data(shards, dst)
    ledger = json.loads((dst / LEDGER).read_text())
    ledger["files"]["train-000000.tar"]["sha256"] = "0" * 64  # as if the copy had rotted
    (dst / LEDGER).write_text(json.dumps(ledger))
    assert stage(sorted(shards.iterdir()), shards, dst)["copied_files"] == 0  # untouched: cheap
    result = cli("data", "stage", shards, dst)
    assert result.exit_code == 2 and "train-000000.tar: the staged copy changed" in result.output


def test_data_stage_refuses_a_destination_inside_its_source(shards: Path, tmp_path: Path):
    for dst in (shards, shards / "local"):
        result = cli("data", "stage", shards, dst)
        assert result.exit_code == 2 and "inside the data set it copies" in result.output
        assert len(result.output.strip().splitlines()) == 1
    assert not (shards / "local").exists() and not (shards / LEDGER).exists()


def test_data_stage_refuses_a_folder_that_is_no_data_set(tmp_path: Path):
    folder = tmp_path / "home"
    (folder / "notes").mkdir(parents=True)
    (folder / "notes" / "todo.txt").write_text("x")
    (folder / "photo.bin").write_bytes(b"y")
    result = cli("data", "stage", folder, tmp_path / "local")
    assert result.exit_code == 2 and "not a data set" in result.output, result.output
    assert "dataset.json" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "local").exists()


def test_staging_train_and_val_from_separate_trees_is_allowed(shards: Path, tmp_path: Path):
    """Train shards in one tree and validation shards in another: their common root may hold
    the destination (here tmp_path), which is inside neither source folder."""
    import shutil

    train, val = tmp_path / "nfs" / "train", tmp_path / "scratch" / "val"
    train.mkdir(parents=True)
    val.mkdir(parents=True)
    for name in ("train-000000.tar", "train-000001.tar"):
        shutil.copy(shards / name, train / name)
    shutil.copy(shards / "val-000000.tar", val / "val-000000.tar")
    spec = WebDatasetData(
        name="webdataset",
        urls=str(train / "train-{000000..000001}.tar"),
        val_urls=str(val / "val-000000.tar"),
        stage=tmp_path / "local",
    )
    staged, record = stage_spec(spec)
    assert str(staged.val_urls).startswith(str(tmp_path / "local"))
    assert record["copied_files"] == 3
    with pytest.raises(UserError, match="inside the data set it copies"):
        stage_spec(spec.model_copy(update={"stage": train / "copy"}))


def test_a_data_sets_listing_and_ledger_are_as_readable_as_its_shards(shards: Path, tmp_path):
    """The defect: dataset.json (and a stage's ledger) were written 0600 through the atomic
    writer's private temp file, while the shards got the umask's 0644: a data set converted to
    shared storage could not be read by the others it was staged for."""
    shard_mode = next(shards.glob("*.tar")).stat().st_mode & 0o777
    assert (shards / "dataset.json").stat().st_mode & 0o777 == shard_mode
    stage_data(shards, tmp_path / "local")
    assert (tmp_path / "local" / LEDGER).stat().st_mode & 0o777 == shard_mode
