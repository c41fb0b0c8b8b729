"""Bad input through the command line (issue 17, points 9, 10, 11, 13): one line and exit 2
from validate and train, single and multi-process; a sweep whose every trial fails exits 1."""

import json
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlscale.cli.main import app

runner = CliRunner()

FACTORIES = """
import sys
import torch

def raises(num_classes=10):
    raise RuntimeError("my factory broke")

def exits(num_classes=10):
    sys.exit(3)

class Scalar(torch.nn.Module):
    def __init__(self, input_size):
        super().__init__()
        self.linear = torch.nn.Linear(input_size, 1)

    def forward(self, x):
        return self.linear(x.flatten(1)).sum()

def scalar(input_size):
    return Scalar(input_size)
"""

BASE = "name: t\ndata: {name: digits}\nbatch_size: 32\nsteps: 2\ndevice: cpu\n"
DDP = "strategy: {name: ddp, workers: 2}\n"


@pytest.fixture
def folder(tmp_path, monkeypatch):
    (tmp_path / "clinets.py").write_text(textwrap.dedent(FACTORIES))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    sys.modules.pop("clinets", None)


def one_line_exit(result, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


EXPECTED = {
    "raises": "by its factory: RuntimeError: my factory broke (clinets.py, line 6)",
    "exits": "model 'clinets:exits' could not be built by its factory: it called sys.exit(3)",
    "scalar": "returned logits of shape () for 1 sample; expected (1, 10): (batch, classes)",
}


@pytest.mark.parametrize("factory", sorted(EXPECTED))
@pytest.mark.parametrize("command", ["validate", "train"])
def test_user_model_failures_are_one_line(folder: Path, command: str, factory: str):
    spec = folder / "job.yaml"
    spec.write_text(BASE + f"model: {{name: 'clinets:{factory}'}}\n")
    out = ("--out", folder / "run") if command == "train" else ()
    assert EXPECTED[factory] in one_line_exit(run(command, spec, *out))


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["raises", "scalar"])
def test_user_model_failures_in_ddp_workers_are_one_line(folder: Path, factory: str):
    """ddp builds its model in each worker: the worker's error arrives as the same line."""
    spec = folder / "job.yaml"
    spec.write_text(BASE + DDP + f"model: {{name: 'clinets:{factory}'}}\n")
    line = one_line_exit(run("train", spec, "--out", folder / "run"))
    assert EXPECTED[factory] in line


def test_a_seed_too_large_is_refused_by_validate(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text(BASE + "model: {name: mlp}\nseed: 9223372036854775809\n")
    line = one_line_exit(run("validate", spec))
    assert "seed: must be between 0 and 4294967295" in line


def test_duplicate_keys_are_refused_by_validate_and_train(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text(BASE + "model: {name: mlp}\nbatch_size: 64\n")
    for args in (("validate",), ("train", "--out", tmp_path / "run")):
        line = one_line_exit(run(*args[:1], spec, *args[1:]))
        assert "invalid YAML at line 7: duplicate key 'batch_size' (first at line 3)" in line


def test_a_sweep_with_more_folds_than_samples_is_refused_before_any_trial(tmp_path: Path):
    spec = tmp_path / "job.yaml"
    spec.write_text(BASE + "model: {name: mlp}\nsweep: {kfold: 5000}\n")
    for args in (("validate",), ("sweep", "--out", tmp_path / "sweep")):
        line = one_line_exit(run(*args[:1], spec, *args[1:]))
        assert "5000 folds need at least 10000 training samples" in line and "1437" in line
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_a_sweep_whose_every_trial_fails_exits_1_with_a_summary(tmp_path: Path):
    """Each trial's batch is larger than the data: every one fails in its own process."""
    spec = tmp_path / "job.yaml"
    spec.write_text(BASE + "model: {name: mlp}\nsweep: {grid: {batch_size: [4000, 5000]}}\n")
    result = run("sweep", spec, "--out", tmp_path / "sweep", "--parallel", "2", "--json")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.stderr.strip().endswith(errors[0])
    line = errors[0]
    assert line.startswith("error: no trial completed: 2 of 2 trials failed;")
    assert "batch_size 4000 is larger than the training set (1437 samples)" in line
    assert json.loads(result.stdout)["counts"]["failed"] == 2  # the results, as ever
