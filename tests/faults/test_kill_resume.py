"""Kill a training process mid-run, resume it, and get the uninterrupted run's exact weights."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from dlscale import api
from dlscale.cli.main import app
from dlscale.train.checkpoint import latest_checkpoint, list_checkpoints, load_checkpoint

# A GPT with dropout: resuming must restore the RNG stream, the optimizer state (AdamW) and the
# position inside a shuffled epoch, or the weights drift apart. 100 steps an epoch (800 training
# samples): a kill in the first epoch resumes across the epoch's end and its validation.
# `threads: 1`: the run killed in its own process and the runs in the test's split their float
# sums alike.
SPEC = """
name: resume-check
model: {name: gpt, kwargs: {n_layer: 1, d_model: 32, n_head: 2, dropout: 0.1}}
data: {name: synthetic, kind: tokens, task: language_modeling, seq_len: 16, vocab_size: 32,
       num_samples: 1000}
batch_size: 8
steps: 200
optimizer: {name: adamw, lr: 0.003, weight_decay: 0.01}
device: cpu
seed: 7
threads: 1
checkpoint: {every_steps: 20, keep_last: 2}
"""
DLSCALE = [str(Path(sys.executable).parent / "dlscale"), "train"]


def kill_once_checkpointed(spec: Path, out: Path, at_step: int) -> int:
    """Start `dlscale train`, SIGKILL it once a checkpoint at `at_step` or later exists (its
    worker processes die with it); the step of the last checkpoint it left."""
    process = subprocess.Popen(
        [*DLSCALE, str(spec), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while not any(step >= at_step for step, _ in list_checkpoints(out)):
        assert process.poll() is None, "training ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint within 180 s"
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    return list_checkpoints(out)[-1][0]


def assert_resumes_to_the_uninterrupted_weights(
    spec: Path, killed: Path, killed_at: int, steps: int
) -> dict:
    """`train --resume` the killed run, train the spec straight through beside it: the same
    final weights, bit for bit. The resumed run's record.

    Both from this process (only the killed run is about a process that dies): its workers are
    processes that set their own threads, and a single-process spec names its `threads`, so the
    run in this process splits its sums as the killed process did."""
    resumed = CliRunner().invoke(app, ["train", str(spec), "--out", str(killed), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert f"resuming at step {killed_at}" in " ".join(resumed.stdout.split())
    api.train(spec, out_dir=killed.parent / "straight")
    final_resumed = load_checkpoint(latest_checkpoint(killed))
    final_straight = load_checkpoint(latest_checkpoint(killed.parent / "straight"))
    assert final_resumed["step"] == final_straight["step"] == steps
    for name, tensor in final_straight["model"].items():
        assert torch.equal(final_resumed["model"][name], tensor), name
    record = json.loads((killed / "run.json").read_text())
    assert record["resumed_from_step"] == killed_at and record["status"] == "completed"
    return record


@pytest.mark.slow
def test_kill_then_resume_equals_uninterrupted(tmp_path: Path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    killed = tmp_path / "killed"
    killed_at = kill_once_checkpointed(spec, killed, 40)
    assert 40 <= killed_at < 200, "the kill must land mid-run"
    record = json.loads((killed / "run.json").read_text()) if (killed / "run.json").exists() else {}
    assert record.get("status") != "completed"
    record = assert_resumes_to_the_uninterrupted_weights(spec, killed, killed_at, 200)
    # The resumed run keeps the history of the part before the kill.
    assert record["steps"][0]["step"] < killed_at < record["steps"][-1]["step"]


def test_resume_refuses_a_changed_spec(tmp_path: Path):
    # In this process (no kill here): the CLI's exit code and its one line are what count.
    def cli_train(*args) -> object:
        return CliRunner().invoke(app, ["train", str(spec), "--out", str(tmp_path / "run"), *args])

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC.replace("steps: 200", "steps: 20"))
    first = cli_train()
    assert first.exit_code == 0, first.output
    spec.write_text(SPEC.replace("steps: 200", "steps: 40"))
    again = cli_train("--resume")
    assert again.exit_code == 2
    said = " ".join(again.stderr.split())
    assert "was written by a different spec" in said
    assert "steps changed (20 → 40)" in said  # which field: the user need not diff by hand
    assert len(again.stderr.strip().splitlines()) == 1
    # Where its checkpoints are kept and how often they are written change no step: a resume
    # with only those changed continues (the defect: refused like a changed model).
    spec.write_text(
        SPEC.replace("steps: 200", "steps: 20").replace(
            "{every_steps: 20, keep_last: 2}", "{every_steps: 10, keep_last: 5}"
        )
    )
    kept = cli_train("--resume")
    assert kept.exit_code == 0, kept.output
    assert "resuming at step 20" in " ".join(kept.stdout.split())


PIPELINE = """
name: resume-pipeline
model: {name: gpt, kwargs: {n_layer: 2, d_model: 32, n_head: 2, dropout: 0.1}}
data: {name: synthetic, kind: tokens, task: language_modeling, seq_len: 16, vocab_size: 32,
       num_samples: 1000}
batch_size: 8
steps: STEPS
optimizer: {name: adamw, lr: 0.003, weight_decay: 0.01}
device: cpu
seed: 7
checkpoint: {every_steps: 10, keep_last: 2}
strategy: STRATEGY
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("strategy", "steps"),
    [
        pytest.param(
            "{name: pipeline, stages: 2, microbatches: 2, schedule: 1f1b}",
            40,
            marks=pytest.mark.heavy,
        ),
        # PipeDream-2BW runs on across steps: the checkpoint must hold the batch in flight.
        pytest.param(
            "{name: pipeline, stages: 2, microbatches: 2, schedule: 2bw}",
            40,
            marks=pytest.mark.heavy,
        ),
        pytest.param(
            "{name: hybrid, data_parallel: 2, stages: 2, microbatches: 2}",
            40,
            marks=pytest.mark.heavy,
        ),
        # 50 steps an epoch: the resumed run also crosses an epoch end and its validation.
        ("{name: ddp, workers: 2}", 60),
        # Dropout in the split attention and MLP: each group's one stream comes back too.
        pytest.param("{name: tensor, degree: 2}", 40, marks=pytest.mark.heavy),
    ],
)
def test_a_killed_parallel_run_resumes_to_the_uninterrupted_weights(tmp_path, strategy, steps):
    """Every trainer's weights, optimizer state and random stream (dropout runs in every stage
    and every replica, each with its own stream) come back from the checkpoint, so the resumed
    run ends where the uninterrupted one does, bit for bit."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(PIPELINE.replace("STEPS", str(steps)).replace("STRATEGY", strategy))
    killed = tmp_path / "killed"
    killed_at = kill_once_checkpointed(spec, killed, 20)
    assert 20 <= killed_at < steps, "the kill must land mid-run"
    assert_resumes_to_the_uninterrupted_weights(spec, killed, killed_at, steps)


@pytest.mark.slow
@pytest.mark.heavy
def test_a_killed_stream_with_loader_workers_and_dropout_resumes_exactly(tmp_path: Path):
    """WebDataset shards read by 2 loader workers, dropout in the model: the resumed run starts
    its workers mid-epoch, the uninterrupted one at the epoch's start, and neither may move the
    RNG that dropout draws from (issue 34: up to 0.099 a weight apart)."""
    from tests.data.test_webdataset import write_shards

    urls = write_shards(tmp_path / "shards")  # 200 samples: 160 train, 16 steps an epoch
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: stream-resume\n"
        "model: {name: mlp, kwargs: {hidden: [16], dropout: 0.5}}\n"
        f"data: {{name: webdataset, urls: '{urls}', num_classes: 4, shuffle_buffer: 20}}\n"
        "batch_size: 10\nepochs: 6\noptimizer: {name: sgd, lr: 0.1}\ndevice: cpu\nseed: 3\n"
        "threads: 1\nloader: {workers: 2}\ncheckpoint: {every_steps: 5, keep_last: 2}\n"
    )
    killed = tmp_path / "killed"
    killed_at = kill_once_checkpointed(spec, killed, 25)
    assert 25 <= killed_at < 96, "the kill must land mid-run"
    # --resume at once: the killed trainer's loader workers, which hold its folder's lock
    # (inherited by fork), must have ended with it
    assert_resumes_to_the_uninterrupted_weights(spec, killed, killed_at, 96)
