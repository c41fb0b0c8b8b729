"""Bench and profile options that would exhaust memory, crash a plot or make no sense (issue 17,
points 12 and 13): one line and exit 2 before any work, or the row skipped with a note."""

import errno
import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dlscale.bench.matmul import run_matmul_bench
from dlscale.bench.output import write_outputs
from dlscale.cli.main import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_exit_2(result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_width_bench_where_no_width_fits_is_refused_before_it_runs(tmp_path: Path):
    line = one_line_exit_2(run("bench", "width", "--widths", "10000000", "--out", tmp_path / "w"))
    # 16 bytes of training state for each of ~1e14 parameters: no machine has that.
    assert "--widths: no width fits in memory: w = 10000000 at batch 64 needs ~1.42 PiB" in line
    assert not (tmp_path / "w" / "width.json").exists()  # nothing measured, nothing written


def test_a_width_bench_plots_the_widths_that_fit_and_notes_the_rest(tmp_path: Path):
    result = run("bench", "width", "--widths", "16,10000000", "--batch", "4", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "width.json").read_text())["rows"]
    assert [row["skipped"] is None for row in rows] == [True, False]
    assert rows[0]["step_time_s"] > 0 and is_png(tmp_path / "width.png")


def test_matmul_sizes_that_do_not_fit_are_skipped_and_refused_when_none_fits(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = one_line_exit_2(run("bench", "matmul", "--sizes", "1000000", "--out", tmp_path / "m"))
    # Two fp32 operands and the result: 3 × 4 × 1e12 bytes.
    assert "--sizes: no size fits in memory: n = 1000000 needs ~10.9 TiB" in line
    assert not (tmp_path / "m" / "matmul.json").exists()
    result = run_matmul_bench([32, 1_000_000], "fp32", min_run_time_s=0.02)
    small, huge = result["rows"]
    assert small["cpu_time_s"] > 0 and small["skipped"] is None
    assert huge["cpu_time_s"] is None and huge["gpu_time_s"] is None
    assert "needs ~10.9 TiB" in huge["skipped"] and "n = 1000000 skipped" in result["note"]
    json_path, png_path = write_outputs("matmul", result, tmp_path / "out")
    assert json.loads(json_path.read_text())["rows"][1]["skipped"] and is_png(png_path)


def test_profile_plot_into_a_file_is_one_line_before_profiling(tmp_path: Path):
    taken = tmp_path / "taken.png"
    taken.write_bytes(b"mine")
    for plot in (taken, taken / "plots"):
        result = run("profile", "lenet", "--hardware", "a100-40gb", "--plot", plot)
        assert f"--plot: {taken} is a file, not a folder" in one_line_exit_2(result)
        assert result.stdout == ""  # refused before the profile was printed
    assert taken.read_bytes() == b"mine"


def test_profile_plot_into_a_read_only_place_is_one_line(tmp_path: Path, monkeypatch):
    def refuse(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    result = run("profile", "lenet", "--hardware", "a100-40gb", "--plot", tmp_path / "plots")
    line = one_line_exit_2(result)
    assert f"--plot: cannot create the folder {tmp_path / 'plots'}: read-only file system" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["profile", "lenet", "--dataset-size", "-5"], "--dataset-size must be a positive number"),
        (["profile", "lenet", "--dataset-size", "0"], "--dataset-size must be a positive number"),
        (
            ["profile", "lenet", "--dataset-size", "10", "--batch", "32"],
            "10 training samples per epoch are fewer than one batch (32)",
        ),
        (["scale", "SPEC", "--steps", "0", "--workers", "1"], "--steps: must be a positive"),
        (["scale", "SPEC", "--workers", "1,2,1"], "--workers: 1 is given twice"),
    ],
)
def test_numeric_options_out_of_range_are_one_line(tmp_path: Path, args, expected):
    spec = tmp_path / "job.yaml"
    spec.write_text("name: t\nmodel: {name: mlp}\ndata: {name: digits}\nbatch_size: 8\n")
    args = [str(spec) if a == "SPEC" else a for a in args]
    out = ["--out", tmp_path / "scale"] if args[0] == "scale" else []
    assert expected in one_line_exit_2(run(*args, *out))
    assert not list(tmp_path.glob("scale/**/*.json"))  # no run started


def test_profile_plot_into_a_place_it_cannot_write_is_refused_before_profiling(
    tmp_path: Path, monkeypatch
):
    def refuse(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    result = run("profile", "lenet", "--hardware", "a100-40gb", "--plot", tmp_path / "plots")
    assert "read-only file system" in one_line_exit_2(result)
    assert result.stdout == ""  # refused before the profile was printed


def test_profile_plots_on_a_full_disk_are_one_line_and_leave_no_partial_file(
    tmp_path: Path, monkeypatch
):
    from dlscale import atomic
    from tests.faults.test_disk_full import FillingDisk

    real_fdopen = atomic.os.fdopen
    monkeypatch.setattr(
        atomic.os, "fdopen", lambda fd, mode: FillingDisk(real_fdopen(fd, mode), 1000)
    )
    plots = tmp_path / "plots"
    result = run("profile", "lenet", "--hardware", "a100-40gb", "--plot", plots)
    assert result.exit_code != 0 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"cannot write {plots / 'working_set.png'}: no space left on device" in lines[0]
    assert list(plots.iterdir()) == []  # no half-written PNG, no temp file


@pytest.mark.parametrize("bench", ["precision", "levels", "sparsity"])
def test_a_bench_refuses_a_bad_out_before_measuring(tmp_path: Path, monkeypatch, bench):
    from dlscale.api import bench as bench_verbs

    def measured(*args, **kwargs):
        raise AssertionError("measured before --out was checked")

    monkeypatch.setattr(bench_verbs, f"bench_{bench}", measured)
    taken = tmp_path / "taken"
    taken.write_text("mine")
    spec = tmp_path / "job.yaml"
    spec.write_text("name: t\nmodel: {name: lenet}\ndata: {name: digits}\nbatch_size: 8\n")
    line = one_line_exit_2(run("bench", bench, spec, "--out", taken))
    assert f"{taken} is a file, not a folder" in line and taken.read_text() == "mine"


def test_bench_levels_caps_max_threads_at_the_cores_before_measuring(tmp_path: Path, monkeypatch):
    from dlscale.bench import levels

    def measured(*args, **kwargs):
        raise AssertionError("measured before --max-threads was checked")

    monkeypatch.setattr(levels, "_steps_in_a_process", measured)
    monkeypatch.setattr(levels, "machine_facts", lambda: {"cores": 4, "numa_nodes": 1})
    spec = tmp_path / "job.yaml"
    spec.write_text("name: t\nmodel: {name: lenet}\ndata: {name: digits}\nbatch_size: 8\n")
    line = one_line_exit_2(run("bench", "levels", spec, "--max-threads", "1000"))
    assert "--max-threads 1000 is more than the 4 cores here" in line
