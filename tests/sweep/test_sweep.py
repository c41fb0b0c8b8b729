"""Sweeps end to end: real trial processes on this machine, their files, failures, resume and
early stopping. Each test trains a handful of small models; together they take about 2 minutes."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from dlscale import api
from dlscale.cli.main import app
from dlscale.jobspec import load_spec
from tests.conftest import EXAMPLES, alive, default_sigint, worker_pids

DLSCALE = Path(sys.executable).parent / "dlscale"


class RecordingSweepReporter:
    def __init__(self):
        self.events: list[tuple[str, object]] = []

    def start(self, info):
        self.events.append(("start", info))

    def update(self, result):
        self.events.append(("update", result))

    def trial_done(self, trial):
        self.events.append(("trial_done", trial))

    def warn(self, message):
        self.events.append(("warn", message))

    def finish(self, result):
        self.events.append(("finish", result))

    def of(self, kind):
        return [payload for name, payload in self.events if name == kind]


def write(folder: Path, spec: dict) -> Path:
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


MLP = {
    "name": "sw",
    "model": {"name": "mlp", "kwargs": {"hidden": 32}},
    "data": {"name": "digits"},
    "batch_size": 64,
    "epochs": 2,
    "device": "cpu",
    "optimizer": {"name": "momentum", "lr": 0.05},
}


@pytest.mark.slow
def test_the_example_grid_with_3_fold_cross_validation(tmp_path: Path):
    reporter = RecordingSweepReporter()
    result = api.sweep(EXAMPLES / "sweep-digits.yaml", tmp_path, parallel=2, reporter=reporter)
    assert result.status == "completed" and result.slots == 2
    trials = result.trials
    assert [t.params for t in trials][:2] == [
        {"optimizer.lr": 0.01, "model.kwargs.hidden": 32},
        {"optimizer.lr": 0.01, "model.kwargs.hidden": 128},
    ]
    assert len(trials) == 6 and all(t.status == "completed" for t in trials)
    for trial in trials:
        assert len(trial.values) == 3
        assert trial.metric == pytest.approx(sum(trial.values) / 3)
        for run in trial.runs:
            record = json.loads((Path(run.run_dir) / "run.json").read_text())
            # Each fold trains on two thirds of the 1,437 training images, validates on a third,
            # and has its own share (half) of the two cores.
            assert record["data"]["train_samples"] + record["data"]["val_samples"] == 1437
            assert record["data"]["val_samples"] in (479, 480)
            assert record["environment"]["torch_threads"] == 1
            assert record["final"]["val_accuracy"] == run.val_accuracy
    best = max(trials, key=lambda t: t.metric)
    assert result.best.id == best.id and best.metric > 0.9
    # The best configuration, ready to train: the sweep's values, no sweep section, no fold.
    spec = load_spec(tmp_path / "best.yaml")
    assert spec.sweep is None and spec.data.fold is None
    assert spec.optimizer.lr == best.params["optimizer.lr"]
    assert spec.model.kwargs["hidden"] == best.params["model.kwargs.hidden"]
    rows = (tmp_path / "results.csv").read_text().splitlines()
    assert rows[0].startswith("trial,optimizer.lr,model.kwargs.hidden,status,val_accuracy")
    assert len(rows) == 7
    for plot in ("trials.png", "params.png", "kfold.png"):
        assert (tmp_path / plot).stat().st_size > 10_000
    assert json.loads((tmp_path / "results.json").read_text()) == result.to_json()
    assert len(reporter.of("trial_done")) == 6 and reporter.of("update")
    # Two long-lived slots ran all 18 runs, one after another, each setting up in its slot.
    runs = [run for trial in trials for run in trial.runs]
    assert len({run.pid for run in runs}) == 2 and {run.slot for run in runs} == {0, 1}
    assert all(run.setup_s > 0 and run.global_batch_size == 64 for run in runs)
    assert all(t.global_batch_size == 64 for t in trials)
    gaps = result.slot_gaps_s
    assert gaps.count == 16 and 0 <= gaps.median <= gaps.max
    assert reporter.of("finish")[0] == result.to_json()  # the reporter is shown the document


@pytest.mark.slow
def test_a_failing_trial_is_recorded_and_an_interrupted_sweep_resumes(tmp_path: Path):
    spec = write(
        tmp_path, {**MLP, "epochs": 3, "sweep": {"grid": {"batch_size": [32, 5000, 64, 16]}}}
    )
    out = tmp_path / "out"
    command = [str(DLSCALE), "sweep", str(spec), "--out", str(out), "--parallel", "1"]
    first = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=default_sigint,  # stopped with SIGINT below
    )
    failed = out / "trials" / "t001" / "train" / "result.json"
    deadline = time.monotonic() + 120
    while not failed.is_file() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.1)
    assert failed.is_file(), first.communicate()[0]
    tasks = worker_pids(first.pid)
    while not tasks and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)  # between two trials: wait for the third one's process
        tasks = worker_pids(first.pid)
    first.send_signal(signal.SIGINT)  # Ctrl-C while the third trial starts
    output = first.communicate(timeout=60)[0]
    assert first.returncode == 130, output
    assert "continue later with --resume" in output
    interrupted = json.loads((out / "results.json").read_text())
    assert interrupted["status"] == "interrupted"
    assert [t["status"] for t in interrupted["trials"][:2]] == ["completed", "failed"]
    finished = out / "trials" / "t000" / "train" / "run.json"
    stamp = finished.stat().st_mtime_ns
    assert tasks and _gone(tasks)  # no trial process outlives the sweep

    # The resume from this process (the interrupted sweep was the process under test).
    again = CliRunner().invoke(app, [*command[1:], "--resume", "--json"])
    assert again.exit_code == 0, again.output
    result = json.loads(again.stdout)
    assert "resuming, 2 trial(s) already done" in again.stderr
    assert [t["status"] for t in result["trials"]] == [
        "completed",
        "failed",
        "completed",
        "completed",
    ]
    assert "batch_size 5000 is larger than the training set" in result["trials"][1]["error"]
    assert finished.stat().st_mtime_ns == stamp  # the finished trial was not run again
    assert result["started_at"] == interrupted["started_at"]  # when the sweep first began
    assert result["counts"] == {
        "completed": 3,
        "failed": 1,
        "pruned": 0,
        "running": 0,
        "pending": 0,
    }


def _gone(pids: list[int], within_s: float = 10.0) -> bool:
    """Every process has exited within `within_s` (a zombie nobody reaped yet has exited)."""
    deadline = time.monotonic() + within_s
    while any(alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.slow
def test_an_ensemble_scores_its_members_averaged_predictions(tmp_path: Path):
    spec = write(tmp_path, {**MLP, "seed": 4, "sweep": {"ensemble": 3}})
    result = api.sweep(spec, tmp_path / "out", parallel=2)
    (trial,) = result.trials
    assert trial.status == "completed"
    probabilities, labels = [], None
    for index, run in enumerate(trial.runs):
        record = json.loads((Path(run.run_dir) / "run.json").read_text())
        assert record["spec"]["seed"] == 4 + index and record["spec"]["data"]["seed"] == 4
        saved = torch.load(Path(run.run_dir) / "predictions.pt", weights_only=True)
        member_accuracy = float(
            (saved["probabilities"].argmax(-1) == saved["labels"]).float().mean()
        )
        assert member_accuracy == pytest.approx(run.val_accuracy, abs=1e-6)
        if labels is not None:
            assert torch.equal(saved["labels"], labels)  # one validation set for all
        labels = saved["labels"]
        probabilities.append(saved["probabilities"])
    averaged = torch.stack(probabilities).mean(0).argmax(-1)
    expected = float((averaged == labels).float().mean())
    assert trial.metric == pytest.approx(expected)
    assert trial.ensemble.members == [r.val_accuracy for r in trial.runs]
    assert len({round(v, 6) for v in trial.ensemble.members}) > 1  # different seeds
    assert (tmp_path / "out" / "ensemble.png").is_file()


@pytest.mark.slow
def test_early_stopping_stops_a_trailing_trial(tmp_path: Path):
    lenet = {
        **MLP,
        "model": {"name": "lenet"},
        "data": {"name": "digits", "image_size": 28},
        "batch_size": 32,
        "epochs": 8,
    }
    sweep = {
        "grid": {"optimizer.lr": [0.05, 1.0e-6]},
        "early_stopping": {"rule": "median", "min_runs": 1},
    }
    result = api.sweep(write(tmp_path, {**lenet, "sweep": sweep}), tmp_path / "out", parallel=1)
    good, bad = result.trials
    assert good.status == "completed" and len(good.runs[0].curve) == 8
    assert bad.status == "pruned" and bad.metric is None
    run = bad.runs[0]
    assert run.status == "pruned" and 1 <= len(run.curve) < 8
    assert run.error == f"stopped early after epoch {run.curve[-1].epoch}"
    assert bad.stopped_at.val_accuracy < good.runs[0].curve[0].val_accuracy
    assert result.counts.pruned == 1 and result.best.id == good.id
