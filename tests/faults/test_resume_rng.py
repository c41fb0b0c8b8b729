"""A resumed run draws the dropout masks the uninterrupted one drew: the random streams are
saved with every checkpoint and put back, on the CPU and on a GPU."""

import shutil
from pathlib import Path

import pytest
import torch

from dlscale import api
from dlscale.jobspec import parse_spec
from dlscale.train.checkpoint import checkpoint_path, latest_checkpoint, load_checkpoint
from tests.conftest import RecordingReporter

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
    ),
]


def dropout_spec(device: str):
    return parse_spec(
        {
            "name": "resume-rng",
            "device": device,
            "seed": 3,
            "model": {
                "name": "gpt",
                "kwargs": {"n_layer": 1, "d_model": 16, "n_head": 2, "dropout": 0.5},
            },
            "data": {
                "name": "synthetic",
                "kind": "tokens",
                "task": "language_modeling",
                "seq_len": 8,
                "vocab_size": 16,
                "num_samples": 200,
            },
            "batch_size": 8,
            "steps": 12,
            "optimizer": {"name": "adamw", "lr": 0.01},
            "checkpoint": {"every_steps": 4, "keep_last": 10},
        }
    )


@pytest.mark.parametrize("device", DEVICES)
def test_a_resume_mid_epoch_ends_on_the_uninterrupted_weights(tmp_path: Path, device: str):
    """Steps 9..12 after a resume from step 8 draw the masks steps 9..12 drew straight through
    (half the activations dropped: any other stream moves the weights)."""
    spec = dropout_spec(device)
    api.train(spec, out_dir=tmp_path / "straight")
    resumed_dir = tmp_path / "resumed"
    checkpoint_path(resumed_dir, 8).parent.mkdir(parents=True)
    shutil.copy(checkpoint_path(tmp_path / "straight", 8), checkpoint_path(resumed_dir, 8))
    reporter = RecordingReporter()
    record = api.train(spec, out_dir=resumed_dir, resume=True, reporter=reporter)
    assert record.resumed_from_step == 8 and reporter.of("start")[0]["resumed"]
    straight = load_checkpoint(latest_checkpoint(tmp_path / "straight"))["model"]
    resumed = load_checkpoint(latest_checkpoint(resumed_dir))["model"]
    for name, tensor in straight.items():
        assert torch.equal(resumed[name], tensor), name
