"""`dlscale bench io`: storage, decoding and the model measured side by side on data read from
disk, the verdict naming the bound, and a one-line refusal for data held in memory."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from rich.console import Console
from typer.testing import CliRunner

from dlscale.bench import io as bench_io
from dlscale.bench.io import decode_rate, file_pieces, storage_read
from dlscale.bench.io_verdict import io_verdict
from dlscale.cli.bench_io import io_table
from dlscale.cli.main import app
from dlscale.data.lazy import LazyDataset, io_stats
from dlscale.data.stream import StreamDataset
from dlscale.errors import UserError

runner = CliRunner()


def image_folder(root: Path, per_class: int = 12) -> Path:
    rng = np.random.default_rng(0)
    for name in ("cat", "dog"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


def write_spec(path: Path, data: str, workers: int = 0) -> Path:
    path.write_text(
        f"name: io\nmodel: {{name: mlp, kwargs: {{hidden: [16]}}}}\ndata: {data}\n"
        f"batch_size: 4\nsteps: 2\nloader: {{workers: {workers}}}\n"
    )
    return path


def test_bench_io_measures_storage_decoding_and_the_model_on_an_image_folder(tmp_path: Path):
    folder = image_folder(tmp_path / "images")
    spec = write_spec(tmp_path / "spec.yaml", f"{{name: images, path: {folder}}}", workers=2)
    out = tmp_path / "out"
    args = ["bench", "io", spec, "--readers", "3", "--seconds", "0.2", "--json", "--out", out]
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert json.loads((out / "io.json").read_text()) == printed
    assert (out / "io.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    one, many = printed["storage_one_reader"], printed["storage_readers"]
    assert (one["readers"], many["readers"]) == (1, 3)
    files_bytes = sum(p.stat().st_size for p in folder.rglob("*.png"))
    for storage in (one, many):  # each byte of the training files read at most once
        assert 0 < storage["read_bytes"] <= printed["files_bytes"] < files_bytes
        assert storage["read_bytes_per_s"] > 0
    decode, model = printed["decode_one_worker"], printed["model_step"]
    assert decode["samples"] > 0 and decode["samples_per_s"] > 0 and decode["bad_samples"] == 0
    assert decode["read_s_per_sample"] > 0 and decode["decode_s_per_sample"] > 0
    assert model["steps"] >= 3 and model["samples_per_s"] > 0 and model["step_time_s"] > 0
    # The decode bound is the workers' together, as the spec runs them.
    bounds = printed["bounds_samples_per_s"]
    assert bounds["decode"] == pytest.approx(2 * decode["samples_per_s"])
    assert printed["slowest_measured"] == min(bounds, key=bounds.get)
    assert printed["workers_needed"] >= 1
    # A busy machine may leave the measurements too noisy to name the bound: then none is named.
    assert printed["bound"] == (printed["slowest_measured"] if printed["verdict_drawn"] else None)
    assert printed["page_cache_dropped"] is hasattr(os, "posix_fadvise")
    assert len(printed["load_average_1m_5m_15m"]) == 3 and printed["cores"] >= 1
    # The table: every measurement, with units, and the verdict beneath.
    console = Console(width=100, record=True)
    console.print(io_table(printed))
    text = console.export_text()
    for label in (
        "storage, 1 reader",
        "storage, 3 readers",
        "decode, 1 loader worker",
        "decode, 2 loader workers",
        "model step (cpu)",
        "samples/s",
        "MB/s",
    ):
        assert label in text
    assert ("bounds training" if printed["verdict_drawn"] else "noisy: no verdict") in text
    assert "page cache" in text


def test_bench_io_refuses_data_held_in_memory_in_one_line(tmp_path: Path):
    spec = write_spec(tmp_path / "spec.yaml", "{name: synthetic, num_samples: 64}")
    out = tmp_path / "out"
    result = runner.invoke(app, ["bench", "io", str(spec), "--out", str(out)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert "bench io measures data read from disk; data 'synthetic' is held in memory" in line
    assert not (out / "io.json").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--readers", "0"], "--readers: must be a positive integer (got 0)"),
        (["--seconds", "0"], "--seconds: must be a positive number of seconds (got 0)"),
        (["--seconds", "inf"], "--seconds: must be a positive number of seconds (got inf)"),
        (["--seconds", "nan"], "--seconds: must be a positive number of seconds (got nan)"),
    ],
)
def test_bench_io_bad_options_are_one_line_before_any_work(tmp_path: Path, args, expected):
    folder = image_folder(tmp_path / "images", per_class=1)
    spec = write_spec(tmp_path / "spec.yaml", f"{{name: images, path: {folder}}}")
    result = runner.invoke(app, ["bench", "io", str(spec), *args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip().splitlines() == [f"error: {expected}"]
    assert "measuring" not in result.stdout  # refused before it says it measures


def test_the_verdict_names_the_bound_and_the_loader_workers_that_remove_it():
    decode = io_verdict(storage_per_s=1000, worker_per_s=100, model_per_s=450, workers=2, cores=8)
    assert decode["bound"] == "decode" and decode["workers_needed"] == 5  # ceil(450 / 100)
    assert decode["bounds_samples_per_s"] == {"storage": 1000, "decode": 200, "model": 450}
    assert "set loader.workers: 5" in decode["verdict"] and "cores" not in decode["verdict"]
    crowded = io_verdict(1000, 100, 450, 2, cores=4)
    assert "more than the 4 cores here" in crowded["verdict"]
    model = io_verdict(1000, 500, 300, workers=0, cores=8)  # no workers: the trainer decodes
    assert model["bound"] == "model" and model["workers_needed"] == 1
    assert model["verdict"].startswith("the model bounds training (300 samples/s)")
    storage = io_verdict(50, 500, 300, 2, 8)
    assert storage["bound"] == "storage" and "data.stage: DIR" in storage["verdict"]


def test_storage_readers_share_the_files_and_read_each_byte_once(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_io, "PIECE_BYTES", 1000)  # a file is split for concurrent readers
    monkeypatch.setattr(bench_io, "BLOCK_BYTES", 300)
    files = []
    for size in (2500, 10, 999):
        files.append(tmp_path / f"{size}.bin")
        files[-1].write_bytes(os.urandom(size))
    pieces = file_pieces([str(f) for f in files])
    assert [(Path(p).name, at, n) for p, at, n in pieces] == [
        ("2500.bin", 0, 1000),
        ("2500.bin", 1000, 1000),
        ("2500.bin", 2000, 500),
        ("10.bin", 0, 10),
        ("999.bin", 0, 999),
    ]
    for readers in (1, 3):
        # A budget far beyond what 3.5 kB takes: every piece is read, each exactly once.
        measured = storage_read(pieces, readers, seconds=60)
        assert measured["read_bytes"] == 3509 and measured["all_read"]
        assert measured["pieces_opened"] == len(pieces)
    with pytest.raises(UserError, match=r"missing\.tar: cannot read it"):
        file_pieces([str(tmp_path / "missing.tar")])


class Counting(LazyDataset):
    """Samples whose read and decode are bookkept by LazyDataset: 10 bytes each."""

    def __init__(self, length: int):
        super().__init__(length)
        self.seen: list[int] = []

    def read(self, index):
        self.seen.append(index)
        return index, 10

    def decode(self, raw, index):
        return torch.full((3,), float(raw)), raw % 2

    def where(self, index):
        return f"sample {index}"

    def files(self):
        return []


class Stream(StreamDataset):
    """A stream of 20 samples in batches, as WebDataset shards yield them."""

    def __len__(self):
        return 20

    def batches(
        self,
        epoch,
        start_batch,
        batch_size,
        rank=0,
        world=1,
        part=(0, 1),
        shuffle=True,
        drop_last=True,
    ):
        for first in range(0, 20, batch_size):
            count = min(batch_size, 20 - first)
            io = io_stats(
                read_s=0.001 * count, decode_s=0.003 * count, read_bytes=7 * count, samples=count
            )
            yield torch.zeros(count, 3), torch.zeros(count, dtype=torch.long), io


def test_one_worker_decodes_a_seeded_shuffle_or_the_stream_and_splits_read_from_decode():
    data = Counting(20)
    # A budget far beyond 20 samples' work: the whole epoch is read, once, shuffled by the seed.
    measured = decode_rate(data, batch_size=8, seconds=60, seed=3)
    assert (measured["batches"], measured["samples"]) == (3, 20)
    assert sorted(data.seen) == list(range(20)) and data.seen != list(range(20))
    assert measured["read_bytes_per_sample"] == 10 and measured["bad_samples"] == 0
    again = Counting(20)
    decode_rate(again, batch_size=8, seconds=60, seed=3)
    assert again.seen == data.seen
    streamed = decode_rate(Stream(), batch_size=8, seconds=60, seed=3)
    assert (streamed["batches"], streamed["samples"]) == (3, 20)
    assert streamed["read_s_per_sample"] == pytest.approx(0.001)
    assert streamed["decode_s_per_sample"] == pytest.approx(0.003)
    assert streamed["read_bytes_per_sample"] == 7


def test_profiling_a_spec_read_from_disk_gives_the_rate_and_points_to_bench_io(tmp_path: Path):
    from dlscale.hardware.device import Hardware
    from dlscale.profiler import profile
    from dlscale.profiler.target import resolve

    gpu = Hardware(
        name="toy",
        display_name="toy",
        kind="gpu",
        vendor="x",
        peak_flops={"fp32": 100e12},
        memory_bytes=10 * 2**30,
        memory_bandwidth_bytes_per_s=1e12,
        host_link_bytes_per_s=10e9,
        compute_efficiency=0.5,
        memory_efficiency=0.5,
        op_overhead_s=1e-6,
    )
    folder = image_folder(tmp_path / "images")
    spec = write_spec(tmp_path / "spec.yaml", f"{{name: images, path: {folder}}}")
    (report,) = profile(resolve(str(spec)), [gpu]).reports
    (note,) = [n for n in report.verdict.advice if "samples/s" in n]
    # It is streamed already: no advice to convert it, but the rate it must arrive at.
    assert note.startswith("the data set is read from disk while training: the loader must ")
    assert "webdataset" not in note and "dlscale bench io" in note


def test_bench_io_reads_webdataset_shards_as_one_loader_worker_streams_them(tmp_path: Path):
    from dlscale.data.convert import convert

    shards = tmp_path / "shards"
    convert("synthetic", shards, max_bytes=20_000, samples=200, shape=[3, 8, 8], classes=4)
    train = sorted(p.name for p in shards.glob("train-*.tar"))
    urls = f"{shards}/train-{{000000..{len(train) - 1:06d}}}.tar"
    data = f'{{name: webdataset, urls: "{urls}", val_urls: "{shards}/val-000000.tar"}}'
    spec = write_spec(tmp_path / "spec.yaml", data)
    result = runner.invoke(
        app,
        ["bench", "io", str(spec), "--seconds", "0.2", "--json", "--out", str(tmp_path / "out")],
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["files"] == len(train) > 1
    assert printed["files_bytes"] == sum((shards / name).stat().st_size for name in train)
    assert printed["decode_one_worker"]["samples"] > 0 and printed["model_step"]["steps"] >= 3
    assert printed["slowest_measured"] in ("storage", "decode", "model")


def fake_measurement(step_spread: float, model_per_s: float = 110.0) -> dict:
    """What `measure` returns, for a spec with `threads: 1` whose decoding (one worker, 100
    samples/s) and model (110 unless told) run at nearly the same rate: the case whose verdict
    flipped on a busy machine."""
    storage = {
        "readers": 1,
        "read_bytes": 10**8,
        "pieces_opened": 1,
        "seconds": 1.0,
        "read_bytes_per_s": 1e8,
        "all_read": True,
    }
    return {
        "device": "cpu",
        "threads": 1,
        "files": 1,
        "files_bytes": 10**8,
        "filesystem": "ext4",
        "samples": 1000,
        "page_cache_dropped": True,
        "storage_one_reader": storage,
        "storage_readers": storage,
        "contention_ratio": 1.0,
        "decode_one_worker": {
            "batches": 10,
            "samples": 100,
            "seconds": 1.0,
            "samples_per_s": 100.0,
            "read_s_per_sample": 1e-3,
            "decode_s_per_sample": 9e-3,
            "read_bytes_per_sample": 1e5,
            "bad_samples": 0,
            "batch_spread": 0.05,
        },
        "model_step": {
            "steps": 20,
            "step_time_s": 0.04,
            "samples_per_s": model_per_s,
            "step_spread": step_spread,
        },
    }


def fabricated_io_bench(tmp_path: Path, monkeypatch, load: float, step_spread: float, model=110.0):
    spec = write_spec(tmp_path / "spec.yaml", f"{{name: images, path: {tmp_path}}}", workers=1)
    monkeypatch.setattr(bench_io, "measure", lambda *_: fake_measurement(step_spread, model))
    monkeypatch.setattr(bench_io, "load_averages", lambda: [load, load, load])
    from dlscale.jobspec import load_spec

    return bench_io.run_io_bench(load_spec(spec), None, 1.0, cores=2)


@pytest.mark.parametrize(
    ("load", "step_spread", "noisy"), [(0.1, 0.05, False), (3.5, 0.05, True), (0.1, 0.9, True)]
)
def test_a_close_call_measured_on_a_busy_machine_is_noisy_and_draws_no_verdict(
    tmp_path: Path, monkeypatch, load, step_spread, noisy
):
    # Decoding 100 samples/s (one worker), the model 110: 1.10× apart.
    result = fabricated_io_bench(tmp_path, monkeypatch, load, step_spread)
    assert result["slowest_measured"] == "decode" and result["runner_up"] == "model"
    assert result["runner_up_ratio"] == pytest.approx(1.10)
    assert result["noisy"] is noisy and result["verdict_drawn"] is not noisy
    if noisy:
        assert result["bound"] is None
        assert result["verdict"].startswith(
            "noisy: no verdict: decode (100 samples/s) and model (110) are within 1.10× of "
            "each other"
        )
        reason = "load average 3.5 on 2 cores" if load > 1 else "model's steps varied by 90%"
        assert reason in result["verdict"] and "bounds training" not in result["verdict"]
    else:
        assert result["bound"] == "decode" and result["noise"] == []
        assert result["verdict"].startswith("decoding bounds training")
        assert "noisy" not in result["verdict"]
    # The table shows each rate's spread, marked where it is over 25%.
    console = Console(width=200, record=True)
    console.print(io_table(result))
    text = console.export_text()
    assert "batches ±5%" in text
    assert ("steps ±90% noisy" if step_spread > 0.25 else "steps ±5%") in text


@pytest.mark.parametrize(
    ("model", "step_spread", "drawn"),
    [
        (400.0, 0.9, True),  # 4.0× apart: farther than a 90% spread can move it
        (180.0, 0.3, True),  # 1.8×, noisy: past CLOSE_CALL (1.5) and past 1 + 30%
        (180.0, 0.9, False),  # 1.8× but the steps spread 90%: within 1.9×, no verdict
        (140.0, 0.3, False),  # 1.4×: within CLOSE_CALL
    ],
)
def test_a_noisy_verdict_stands_only_where_the_runner_up_is_farther_than_the_noise(
    tmp_path: Path, monkeypatch, model, step_spread, drawn
):
    result = fabricated_io_bench(tmp_path, monkeypatch, 0.1, step_spread, model)
    assert result["noisy"] and result["verdict_drawn"] is drawn
    assert result["runner_up_ratio"] == pytest.approx(model / 100)
    if drawn:
        assert result["bound"] == "decode" and result["verdict"].startswith("decoding bounds")
        assert f"is {model / 100:.1f}× away, so the verdict likely holds" in result["verdict"]
    else:
        assert result["bound"] is None and result["verdict"].startswith("noisy: no verdict")
