"""Small mistakes that were accepted in silence (issue 34, point 8): an option that does nothing,
an empty folder name, a boolean seed, leave-one-out folds, duplicate JSON keys, start-of-run
warnings missing from run.json, specs that validate passed and train refused, and compare's
worker counts of model-parallel runs."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale import api
from dlscale.bench.compare import compare_row
from dlscale.cli.main import app
from dlscale.jobspec import parse_spec

runner = CliRunner()
BASE = "name: t\nmodel: {name: mlp}\ndata: {name: digits}\nbatch_size: 32\nsteps: 2\ndevice: cpu\n"


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def refused(result, *expected: str) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def spec_file(tmp_path: Path, extra: str = "", base: str = BASE) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(base + extra)
    return path


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_address_without_a_ray_cluster_is_refused(tmp_path: Path, command: str):
    spec = spec_file(tmp_path, "sweep: {grid: {optimizer.lr: [0.1]}}\n")
    result = run(command, spec, "--address", "10.0.0.1:6379", "--out", tmp_path / "out")
    refused(result, "--address", "--cluster ray")
    assert not (tmp_path / "out").exists()


def test_an_empty_out_is_refused_and_nothing_lands_in_the_current_folder(
    tmp_path: Path, monkeypatch
):
    spec = spec_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    for args in (["--out", ""], ["--out="]):
        refused(run("train", spec, *args), "--out", "empty")
    assert sorted(os.listdir(tmp_path)) == ["job.yaml"]


@pytest.mark.parametrize(
    "extra, where",
    [
        ("seed: true\n", "seed"),
        ("data: {name: digits, seed: false}\n", "data.seed"),
        ("sweep: {kfold: true}\n", "sweep.kfold"),
        # Every number in a spec, not just the seeds: pydantic reads true as 1 and 1.0.
        ("epochs: true\n", "epochs"),
        ("optimizer: {name: sgd, lr: true}\n", "optimizer.lr"),
        ("strategy: {name: ddp, workers: true}\n", "strategy.workers"),
    ],
)
def test_a_boolean_where_a_number_belongs_is_refused(tmp_path: Path, extra: str, where: str):
    base = BASE.replace("data: {name: digits}\n", "") if extra.startswith("data") else BASE
    base = base.replace("steps: 2\n", "") if extra.startswith("epochs") else base
    refused(run("validate", spec_file(tmp_path, extra, base)), where, "not a boolean")


def test_leave_one_out_folds_are_refused(tmp_path: Path):
    # digits: 1437 training samples; one sample a fold scores each fold 0% or 100%
    for folds in (1437, 719):
        line = refused(run("validate", spec_file(tmp_path, f"sweep: {{kfold: {folds}}}\n")))
        assert "sweep.kfold" in line and "at most 718" in line
    assert run("validate", spec_file(tmp_path, "sweep: {kfold: 718}\n")).exit_code == 0


@pytest.mark.parametrize(
    "command",
    [
        ["profile", "mlp", "--batch", "4"],
        ["bench", "batch", "--model", "mlp", "--batches", "4", "--steps", "1"],
    ],
)
def test_kwargs_json_with_a_key_given_twice_is_refused(command: list[str]):
    result = run(*command, "--kwargs", '{"hidden": [8], "hidden": [16]}')
    refused(result, "--kwargs", "'hidden'", "twice")
    refused(run(*command, "--kwargs", "[1, 2]"), "--kwargs", "JSON object")


def test_start_of_run_machine_warnings_are_kept_in_run_json(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("dlscale.api.capacity.load_average_1m", lambda: 1000.0)
    spec = parse_spec(
        {
            "name": "t",
            "model": {"name": "mlp"},
            "data": {"name": "digits"},
            "batch_size": 32,
            "steps": 2,
            "device": "cpu",
        }
    )
    record = api.train(spec, out_dir=tmp_path / "run")  # no reporter: nothing is printed
    stored = json.loads((tmp_path / "run" / "run.json").read_text())["warnings"]
    busy = [message for message in stored if "this machine is busy" in message]
    assert len(busy) == 1 and record.warnings == stored


@pytest.mark.parametrize(
    "strategy, expected",
    [
        ("{name: pipeline, stages: 2, microbatches: 3}", "does not split into 3 equal"),
        ("{name: pipeline, stages: 2, max_memory_per_worker: 1KiB}", "max_memory_per_worker"),
        ("{name: tensor, degree: 3}", "nothing in model 'mlp' splits over 3"),
    ],
)
def test_validate_refuses_what_train_refuses_before_starting(
    tmp_path: Path, strategy: str, expected: str
):
    spec = spec_file(tmp_path, f"strategy: {strategy}\n")
    refused(run("validate", spec), expected)
    trained = run("train", spec, "--out", tmp_path / "run")  # after warnings of this machine's
    assert trained.exit_code == 2 and expected in trained.output.strip().splitlines()[-1]


def test_validate_refuses_a_global_batch_larger_than_the_data(tmp_path: Path):
    big = BASE.replace("batch_size: 32", "batch_size: 1000")
    spec = spec_file(tmp_path, "strategy: {name: ddp, workers: 2}\n", big)
    refused(run("validate", spec), "batch_size 1000 × 2 workers is larger than the training set")


@pytest.mark.parametrize(
    "strategy, processes",
    [
        ({"name": "pipeline", "stages": 2}, 2),
        ({"name": "hybrid", "stages": 2, "data_parallel": 2}, 4),
        ({"name": "tensor", "degree": 2}, 2),
        ({"name": "tensor", "degree": 2, "data_parallel": 2}, 4),
        ({"name": "ddp", "workers": 3}, 3),
        ({"name": "ps", "mode": "async", "workers": 3, "servers": 2}, 3),
        ({"name": "single"}, 1),
    ],
)
def test_compare_counts_the_processes_that_trained(strategy: dict, processes: int):
    record = {
        "spec": {"strategy": strategy},
        "final": {"wall_s": 1.0, "train_samples_per_s": 10.0, "step": 5},
        "epochs": [{"epoch": 1, "val_accuracy": 0.5, "val_loss": 1.0, "wall_s": 1.0}],
    }
    assert compare_row(strategy["name"], record, "out")["workers"] == processes
