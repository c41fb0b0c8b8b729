"""What run.json says of a run stopped mid-epoch, and what its epoch says once resumed: the record
exists from the start, names the step its last checkpoint saved and the checkpoints on disk, and
the resumed epoch's train_loss is the mean over all its steps, as the uninterrupted run's."""

import json
import time
from pathlib import Path

import pytest

from dlscale import api
from dlscale.errors import UserError
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


def train_until(monkeypatch, spec: Path, run_dir: Path, step: int, resume: bool = False) -> None:
    """`api.train` into `run_dir`, stopped by Ctrl-C as it finishes `step`."""
    with monkeypatch.context() as patch:
        stop_at(patch, step)
        with pytest.raises(KeyboardInterrupt):
            api.train(spec, out_dir=run_dir, resume=resume)


def test_a_run_stopped_mid_epoch_records_its_last_checkpoint_and_resumes_its_epoch_loss(
    tmp_path: Path, monkeypatch
):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    stopped = tmp_path / "stopped"
    train_until(monkeypatch, spec, stopped, 12)
    record = json.loads((stopped / "run.json").read_text())
    assert (record["status"], record["error"]) == ("interrupted", "stopped by Ctrl-C")
    on_disk = [str(path) for _, path in list_checkpoints(stopped)]
    assert record["checkpoints"] == on_disk and [s for s, _ in list_checkpoints(stopped)] == [5, 10]
    assert record["final"]["step"] == 10  # the step its newest checkpoint holds

    time.sleep(1.1)  # started_at counts seconds: the resume starts in a later one
    resumed = api.train(spec, out_dir=stopped, resume=True).to_json()
    straight = api.train(spec, out_dir=tmp_path / "straight").to_json()
    assert [e["train_loss"] for e in resumed["epochs"]] == [
        e["train_loss"] for e in straight["epochs"]
    ]
    assert resumed["started_at"] == record["started_at"]  # the run began when it first began


def test_a_run_stopped_before_its_first_checkpoint_has_a_record(tmp_path: Path, monkeypatch):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    train_until(monkeypatch, spec, tmp_path / "run", 2)
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["status"] == "interrupted" and record["checkpoints"] == []
    assert record["final"]["step"] == 0
    # Neither a resume nor a new run may take the folder: each says why and what to do.
    with pytest.raises(UserError, match="stopped before its first checkpoint: remove its run"):
        api.train(spec, out_dir=tmp_path / "run", resume=True)
    with pytest.raises(UserError, match=r"\(status: interrupted\) and no checkpoint to resume"):
        api.train(spec, out_dir=tmp_path / "run")


def test_a_run_resumed_with_new_checkpoint_settings_resumes_again_and_predicts(
    tmp_path: Path, monkeypatch
):
    """Checkpoint cadence may change on --resume. Stopped again before the new spec saved a
    checkpoint, the run's record holds the new spec and its newest checkpoint the old hash:
    the next --resume continues (the spec that wrote the checkpoint is the one it carries), and
    the run's model loads for `predict`."""
    from dlscale.infer.trained import load_trained

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    run_dir = tmp_path / "run"
    train_until(monkeypatch, spec, run_dir, 12)
    spec.write_text(SPEC.replace("every_steps: 5", "every_steps: 7"))
    # resumed at 10; its first checkpoint would be at 14
    train_until(monkeypatch, spec, run_dir, 13, resume=True)
    assert [step for step, _ in list_checkpoints(run_dir)] == [5, 10]
    assert load_trained(run_dir).step == 10
    record = api.train(spec, out_dir=run_dir, resume=True).to_json()
    assert record["resumed_from_step"] == 10 and record["status"] == "completed"
