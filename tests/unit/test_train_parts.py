"""The pieces of the loop: batches, checkpoints, timing, the step, the plan."""

from pathlib import Path

import pytest
import torch

from dlscale.errors import UserError
from dlscale.jobspec import OptimizerSpec, parse_spec
from dlscale.train import checkpoint as ckpt
from dlscale.train.metrics import (
    STEP_TIMES_KEPT,
    WARMUP_STEPS,
    StepSampler,
    StepTiming,
    TimingTotals,
    starving_advice,
)
from dlscale.train.plan import Plan
from dlscale.train.sampler import GlobalBatchSampler
from dlscale.train.score import compute_loss
from dlscale.train.step import TrainStep, build_optimizer


def test_sampler_shards_partition_the_global_batches():
    """N workers at batch B see exactly the samples one process sees at batch N·B."""
    whole = GlobalBatchSampler(103, batch_size=12, seed=5, as_lists=True)
    shards = [
        GlobalBatchSampler(103, batch_size=4, seed=5, rank=r, world_size=3, as_lists=True)
        for r in range(3)
    ]
    for epoch in (0, 1):
        whole.set_epoch(epoch)
        for s in shards:
            s.set_epoch(epoch)
        per_worker = list(zip(*(list(s) for s in shards), strict=True))
        for global_batch, parts in zip(list(whole), per_worker, strict=True):
            assert global_batch == [i for part in parts for i in part]
    assert len(whole) == 103 // 12  # the partial last batch is dropped


def test_sampler_epochs_differ_and_resume_skips_done_batches():
    sampler = GlobalBatchSampler(64, batch_size=8, seed=1)
    sampler.set_epoch(0)
    epoch0 = [batch.tolist() for batch in sampler]
    assert all(isinstance(batch, torch.Tensor) for batch in sampler)
    sampler.set_epoch(1)
    assert [batch.tolist() for batch in sampler] != epoch0
    sampler.set_epoch(0, start_batch=3)
    assert [batch.tolist() for batch in sampler] == epoch0[3:] and len(sampler) == 5
    assert sorted(i for batch in epoch0 for i in batch) == list(range(64))


def test_checkpoints_are_pruned_and_loaded_weights_only(tmp_path: Path):
    for step in (10, 20, 30):
        ckpt.save_checkpoint(tmp_path, step, {"model": {"w": torch.full((2,), float(step))}}, 2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [20, 30]
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))
    state = ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path))
    assert state["step"] == 30 and torch.equal(state["model"]["w"], torch.tensor([30.0, 30.0]))


def test_a_checkpoint_holding_code_is_refused(tmp_path: Path):
    """weights_only=True: an object that would run code on load is not unpickled."""
    path = tmp_path / "evil.pt"
    torch.save({"format": 1, "payload": Path("/")}, path)  # an arbitrary class, not plain data
    with pytest.raises(UserError, match="not a readable dlscale checkpoint"):
        ckpt.load_checkpoint(path)


def test_truncated_checkpoint_is_one_clear_line(tmp_path: Path):
    good = ckpt.save_checkpoint(tmp_path, 1, {"model": {"w": torch.ones(1000)}}, 1)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(good.read_bytes()[:500])
    with pytest.raises(UserError) as caught:
        ckpt.load_checkpoint(broken)
    assert str(broken) in str(caught.value) and "\n" not in str(caught.value)


def test_timing_totals_and_starvation_advice():
    totals = TimingTotals()
    for _ in range(3):  # warm-up steps never count towards starvation
        totals.add(StepTiming(data_wait_s=1.0, h2d_s=0.0, compute_s=0.0), samples=10)
    for _ in range(10):
        totals.add(StepTiming(data_wait_s=0.01, h2d_s=0.0, compute_s=0.09), samples=10)
    assert totals.data_wait_fraction == pytest.approx(0.1)
    assert starving_advice(totals, 0, False, "cpu") is None
    for _ in range(10):
        totals.add(StepTiming(data_wait_s=0.09, h2d_s=0.01, compute_s=0.1), samples=10)
    advice = starving_advice(totals, 0, False, "cuda")
    assert advice is not None and "33%" in advice
    assert "loader.workers (now 0)" in advice and "pin_memory" in advice
    assert totals.samples == 230 and totals.summary()["steps"] == 23


def test_step_sampler_keeps_a_bounded_sample_including_the_last_step():
    sampler = StepSampler(total_steps=2000, max_records=500)
    for step in range(1, 2001):
        if sampler.wants(step):
            sampler.records.append({"step": step})
    steps = [r["step"] for r in sampler.records]
    assert len(steps) == 500 and steps[-1] == 2000 and steps[0] == 4


def test_plan_counts_steps_and_rejects_a_batch_larger_than_the_data():
    spec = parse_spec(
        {"name": "t", "model": {"name": "mlp"}, "data": {"name": "digits"}, "batch_size": 100}
    )
    plan = Plan.of(spec, num_train=1437)
    assert (plan.steps_per_epoch, plan.total_steps, plan.epochs) == (14, 14, 1)
    with pytest.raises(UserError, match="larger than the training set"):
        Plan.of(spec, num_train=50)


def test_train_step_matches_a_hand_written_sgd_update():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    optimizer = build_optimizer(model.parameters(), OptimizerSpec(name="sgd", lr=0.5))
    loss = TrainStep(model, optimizer, torch.device("cpu"), "fp32")(x, y)
    expected = torch.nn.functional.cross_entropy(reference(x), y)
    expected.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.5 * p.grad
    assert float(loss) == pytest.approx(float(expected.detach()))
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-6)


def test_sequence_loss_scores_every_position():
    logits = torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    flat = torch.nn.functional.cross_entropy(logits.reshape(10, 7), targets.reshape(10))
    assert torch.allclose(compute_loss(logits, targets), flat)


def test_bf16_autocast_step_runs_on_cpu():
    model = torch.nn.Linear(4, 3)
    optimizer = build_optimizer(model.parameters(), OptimizerSpec(name="adamw"))
    step = TrainStep(model, optimizer, torch.device("cpu"), "bf16")
    before = model.weight.detach().clone()
    loss = step(torch.randn(8, 4), torch.randint(0, 3, (8,)))
    assert torch.isfinite(loss) and not torch.equal(before, model.weight)
    assert model.weight.dtype == torch.float32  # master weights stay fp32


def test_throughput_and_the_median_step_leave_the_warm_up_out():
    """Three slow first steps (lazy init, allocator growth) must not pull the throughput down:
    a short run reported it 1.1–3.7× off its median step before."""
    totals = TimingTotals()
    for seconds in [0.5] * WARMUP_STEPS + [0.01] * 7:
        totals.add(StepTiming(0.0, 0.0, seconds), 10)
    summary = totals.summary()
    assert summary["warmup_steps"] == 3 and summary["warmup_s"] == pytest.approx(1.5)
    assert summary["steady_steps"] == 7 and summary["median_step_s"] == pytest.approx(0.01)
    assert totals.samples_per_s == pytest.approx(10 / 0.01)
    resumed = TimingTotals.from_state(totals.to_state())  # a new process warms up again
    resumed.add(StepTiming(0.0, 0.0, 0.4), 10)
    assert resumed.warmup_steps == 4 and resumed.steady_steps == 7


def test_the_median_keeps_an_even_sample_of_a_long_run():
    totals = TimingTotals()
    steps = WARMUP_STEPS + 3 * STEP_TIMES_KEPT
    for index in range(steps):
        totals.add(StepTiming(0.0, 0.0, 0.001 * (index % 3 + 1)), 1)
    assert len(totals.step_times) < STEP_TIMES_KEPT and totals.step_times_stride > 1
    assert totals.median_step_s == pytest.approx(0.002)


def test_throughput_counts_each_data_parallel_slice_once():
    from dlscale.train.summary import throughput

    stages = [
        {"data_rank": 0, "samples_per_s": 120.0},
        {"data_rank": 0, "samples_per_s": 100.0},
        {"data_rank": 1, "samples_per_s": 110.0},
        None,
    ]
    assert throughput(stages) == (210.0, 105.0)  # a replica runs at its slowest stage's pace
    # While training only one trainer's figures are at hand: the others keep its pace.
    assert throughput([{"data_rank": 0, "samples_per_s": 100.0}], slices=4) == (400.0, 100.0)
