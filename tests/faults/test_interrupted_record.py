"""What run.json says of a run stopped mid-epoch, and what its epoch says once resumed: the record
exists from the start, names the step its last checkpoint saved and the checkpoints on disk, and
the resumed epoch's train_loss is the mean over all its steps, as the uninterrupted run's."""

import json
from pathlib import Path

import pytest

from dlscale import api
from dlscale.train import faults
from dlscale.train.checkpoint import list_checkpoints

# digits: 1,437 training samples, 22 steps an epoch at 64; checkpoints every 5 steps.
SPEC = """
name: stopped
model: {name: mlp, kwargs: {hidden: [32]}}
data: {name: digits}
batch_size: 64
epochs: 2
optimizer: {name: adam, lr: 0.003}
device: cpu
seed: 3
threads: 1
checkpoint: {every_steps: 5, keep_last: 10}
"""


def stop_at(monkeypatch, step: int) -> None:
    """Ctrl-C as the run finishes `step` (before anything is saved for it)."""
    check = faults.Faults.check_loss

    def interrupted(self, loss, at):
        check(self, loss, at)
        if at == step:
            raise KeyboardInterrupt

    monkeypatch.setattr(faults.Faults, "check_loss", interrupted)


def test_a_run_stopped_mid_epoch_records_its_last_checkpoint_and_resumes_its_epoch_loss(
    tmp_path: Path, monkeypatch
):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    stopped = tmp_path / "stopped"
    with monkeypatch.context() as patch:
        stop_at(patch, 12)
        with pytest.raises(KeyboardInterrupt):
            api.train(spec, out_dir=stopped)
    record = json.loads((stopped / "run.json").read_text())
    assert (record["status"], record["error"]) == ("interrupted", "stopped by Ctrl-C")
    on_disk = [str(path) for _, path in list_checkpoints(stopped)]
    assert record["checkpoints"] == on_disk and [s for s, _ in list_checkpoints(stopped)] == [5, 10]
    assert record["final"]["step"] == 10  # the step its newest checkpoint holds

    resumed = api.train(spec, out_dir=stopped, resume=True).to_json()
    straight = api.train(spec, out_dir=tmp_path / "straight").to_json()
    assert [e["train_loss"] for e in resumed["epochs"]] == [
        e["train_loss"] for e in straight["epochs"]
    ]
    assert resumed["started_at"] == record["started_at"]  # the run began when it first began


def test_a_run_stopped_before_its_first_checkpoint_has_a_record(tmp_path: Path, monkeypatch):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    with monkeypatch.context() as patch:
        stop_at(patch, 2)
        with pytest.raises(KeyboardInterrupt):
            api.train(spec, out_dir=tmp_path / "run")
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "interrupted" and record["checkpoints"] == []
    assert record["final"]["step"] == 0
