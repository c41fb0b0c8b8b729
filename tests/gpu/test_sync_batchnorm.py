"""SyncBatchNorm against its reference: ddp with `sync_batchnorm` on two workers at batch B ends
where one process at 2B ends, batch-norm statistics (running mean and variance) and weights
alike; without it the workers normalise by their own halves, and the two runs part.

torch's SyncBatchNorm runs on GPUs only (tests/unit/test_sync_batchnorm.py checks the CPU
refusal). The two workers share one GPU over gloo (NCCL wants a GPU each), so one GPU is
enough; gloo is what torch's SyncBatchNorm gathers through then (a list all_gather)."""

from pathlib import Path

import pytest
import torch

from dlscale import api
from dlscale.jobspec import parse_spec
from tests.small_runs import SGD, base_spec, final_weights, synthetic_images

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU and none is visible here; on a GPU machine run make gpu-check",
    ),
]

RESNET = {"name": "resnet18", "kwargs": {"small_input": True}}  # 20 batch norms
BASE = base_spec("sync-bn", synthetic_images(96), RESNET, steps=3, optimizer=SGD, device="cuda")


def largest_difference(run: Path, reference: Path) -> tuple[str, float]:
    """The tensor of the checkpoint furthest from the reference's: |a − b| / |b|."""
    ours, theirs = final_weights(run), final_weights(reference)
    worst = ("", 0.0)
    for name, expected in theirs.items():
        if not expected.is_floating_point():  # num_batches_tracked: a step count
            assert torch.equal(ours[name], expected), name
            continue
        difference = float((ours[name] - expected).norm() / expected.norm().clamp_min(1e-12))
        worst = max(worst, (name, difference), key=lambda pair: pair[1])
    return worst


def test_sync_batchnorm_equals_one_process_on_the_global_batch(tmp_path: Path):
    api.train(parse_spec({**BASE, "batch_size": 16}), out_dir=tmp_path / "single")
    ddp = {"name": "ddp", "workers": 2, "backend": "gloo"}
    for sync in (True, False):
        spec = {**BASE, "batch_size": 8, "strategy": {**ddp, "sync_batchnorm": sync}}
        record = api.train(parse_spec(spec), out_dir=tmp_path / f"sync-{sync}")
        assert record.final.step == 3
    name, synced = largest_difference(tmp_path / "sync-True", tmp_path / "single")
    assert synced <= 1e-4, (name, synced)
    # The test could fail: each worker's own statistics (rank 0's buffers, broadcast by DDP)
    # are not the global batch's.
    name, plain = largest_difference(tmp_path / "sync-False", tmp_path / "single")
    assert plain >= 1e-3, (name, plain)
