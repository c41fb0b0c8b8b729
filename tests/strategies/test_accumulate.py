"""Gradient accumulation in real runs: K micro-batches of B end on the weights one batch of K·B
does (single, ddp, tensor), ddp all-reduces once per optimizer step, and a resume continues
at an optimizer-step boundary."""

import shutil
from pathlib import Path

import pytest
import torch

from dlscale import api
from dlscale.jobspec import parse_spec
from dlscale.train.checkpoint import checkpoint_path
from tests.small_runs import SGD, base_spec, final_weights, synthetic_images
from tests.strategies.test_pipeline import assert_same_weights

BASE = base_spec("acc-eq", synthetic_images(600), steps=4, optimizer=SGD, device="cpu", seed=5)
LENET_PARAMETERS = 41_282


def test_single_with_k_micro_batches_equals_one_batch_of_k_b(tmp_path: Path):
    big = api.train(parse_spec({**BASE, "batch_size": 24}), out_dir=tmp_path / "big")
    spec = parse_spec({**BASE, "batch_size": 8, "accumulate": 3})
    record = api.train(spec, out_dir=tmp_path / "micro")
    assert_same_weights(tmp_path / "big", tmp_path / "micro")
    # Steps are optimizer steps: 4 of 24 samples each, as the big batch's.
    assert record.final.step == 4 == big.final.step
    assert record.plan.global_batch_size == 24 and record.plan.accumulate == 3
    assert record.timing.samples == big.timing.samples == 4 * 24
    losses = [s.loss for s in record.steps]
    assert losses == pytest.approx([s.loss for s in big.steps], rel=1e-5)


def test_a_resume_continues_at_an_optimizer_step_boundary(tmp_path: Path):
    """Checkpoints every 2 optimizer steps (6 micro-batches): resumed from step 2, the run ends
    on the uninterrupted run's weights."""
    spec = parse_spec(
        {
            **BASE,
            "batch_size": 8,
            "accumulate": 3,
            "checkpoint": {"every_steps": 2, "keep_last": 5},
        }
    )
    api.train(spec, out_dir=tmp_path / "straight")
    resumed = tmp_path / "resumed"
    checkpoint_path(resumed, 2).parent.mkdir(parents=True)
    shutil.copy(checkpoint_path(tmp_path / "straight", 2), checkpoint_path(resumed, 2))
    record = api.train(spec, out_dir=resumed, resume=True)
    assert record.resumed_from_step == 2 and record.final.step == 4
    straight, again = final_weights(tmp_path / "straight"), final_weights(resumed)
    for name, tensor in straight.items():
        assert torch.equal(again[name], tensor), name


@pytest.mark.slow
def test_ddp_accumulating_equals_one_process_and_all_reduces_once_a_step(tmp_path: Path):
    """2 gloo workers × 3 micro-batches of 4 == one process at 24; LeNet's gradients fill one
    DDP bucket, so a step that all-reduced every micro-batch would count 3 and carry 3 × the
    gradients; no_sync leaves one all-reduce of them per optimizer step."""
    api.train(parse_spec({**BASE, "batch_size": 24}), out_dir=tmp_path / "single")
    spec = {**BASE, "batch_size": 4, "accumulate": 3, "strategy": {"name": "ddp", "workers": 2}}
    record = api.train(parse_spec(spec), out_dir=tmp_path / "ddp")
    assert_same_weights(tmp_path / "single", tmp_path / "ddp")
    dist = record.distributed
    assert dist["accumulate"] == 3 and dist["global_batch_size"] == 24
    assert dist["allreduces_per_step"] == 1.0
    assert dist["allreduce_payload_bytes_per_step"] == LENET_PARAMETERS * 4
    assert all(w.steps == 4 and w.samples == 4 * 12 for w in record.workers)


@pytest.mark.slow
def test_tensor_accumulating_equals_one_process(tmp_path: Path):
    """Degree 2: each micro-batch runs the plan's collectives (predicted K × one's); the
    weights end where one process's do at the whole batch."""
    mlp = {"name": "mlp", "kwargs": {"hidden": [32, 16]}}
    base = {**BASE, "model": mlp, "steps": 3}
    api.train(parse_spec({**base, "batch_size": 16}), out_dir=tmp_path / "single")
    spec = {**base, "batch_size": 8, "accumulate": 2, "strategy": {"name": "tensor"}}
    record = api.train(parse_spec(spec), out_dir=tmp_path / "tensor")
    assert_same_weights(tmp_path / "single", tmp_path / "tensor")
    tensor = record.tensor
    assert tensor["accumulate"] == 2 and tensor["global_batch_size"] == 16
    # The plan's one forward all-reduce of (8, 16) fp32 activations, twice a step.
    predicted = tensor["predicted_collectives_per_step"]
    assert predicted == {"all_reduce": {"count": 2, "payload_bytes": 2 * 8 * 16 * 4}}
    assert tensor["collectives_per_step"] == predicted
