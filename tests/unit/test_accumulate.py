"""Gradient accumulation: K micro-batches of B make the step one batch of K·B makes, the spec
refuses it where a strategy has its own, and the plan counts optimizer steps."""

import pytest
import torch

from dlscale.errors import UserError
from dlscale.jobspec import OptimizerSpec, parse_spec
from dlscale.train.exchange import Exchange
from dlscale.train.plan import Plan
from dlscale.train.step import TrainStep, build_optimizer
from tests.small_runs import base_spec

BASE = base_spec("acc", {"name": "digits"}, batch_size=8)


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def steps_of(model, optimizer: str, precision: str, accumulate: int, batches) -> TrainStep:
    step = TrainStep(
        model,
        build_optimizer(model.parameters(), OptimizerSpec(name=optimizer, lr=0.05)),
        torch.device("cpu"),
        precision,
        accumulate=accumulate,
    )
    losses = [float(step(x, y)) for x, y in batches]
    return step, losses


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
@pytest.mark.parametrize("accumulate", [2, 4])
def test_k_micro_batches_of_b_equal_one_batch_of_k_b(optimizer: str, accumulate: int):
    """Parameters after one and after five optimizer steps, and the losses the steps report."""
    generator = torch.Generator().manual_seed(1)
    batches = [
        (
            torch.randn(8 * accumulate, 6, generator=generator),
            torch.randint(0, 4, (8 * accumulate,)),
        )
        for _ in range(5)
    ]
    for count in (1, 5):
        big, micro = mlp(), mlp()
        _, big_losses = steps_of(big, optimizer, "fp32", 1, batches[:count])
        _, micro_losses = steps_of(micro, optimizer, "fp32", accumulate, batches[:count])
        assert micro_losses == pytest.approx(big_losses, rel=1e-5)
        for mine, theirs in zip(micro.parameters(), big.parameters(), strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_the_loss_is_scaled_by_each_micro_batchs_share():
    """One SGD step by hand: the gradient is the mean of the micro-batches' mean-loss
    gradients, (g1 + g2) / 2, not their sum."""
    model, reference = mlp(), mlp()
    x, y = torch.randn(6, 6), torch.randint(0, 4, (6,))
    steps_of(model, "sgd", "fp32", 2, [(x, y)])
    grads = []
    for part in (slice(0, 3), slice(3, 6)):
        reference.zero_grad()
        torch.nn.functional.cross_entropy(reference(x[part]), y[part]).backward()
        grads.append([p.grad.clone() for p in reference.parameters()])
    with torch.no_grad():
        for p, g1, g2 in zip(reference.parameters(), *grads, strict=True):
            p -= 0.05 * (g1 + g2) / 2
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def test_only_the_last_micro_batch_may_synchronise():
    """The exchange's `accumulating` context wraps micro-batches 1..K−1, never the last."""
    seen = []

    class Counting(Exchange):
        def accumulating(self):
            seen.append("local")
            return super().accumulating()

        def after_backward(self, step) -> None:
            seen.append("sync")

    model = mlp()
    optimizer = build_optimizer(model.parameters(), OptimizerSpec(name="sgd"))
    step = TrainStep(model, optimizer, torch.device("cpu"), "fp32", Counting(), accumulate=3)
    step(torch.randn(9, 6), torch.randint(0, 4, (9,)))
    step(torch.randn(9, 6), torch.randint(0, 4, (9,)))
    assert seen == ["local", "local", "sync"] * 2


def test_bf16_accumulation_tracks_the_big_batch():
    """Autocast per micro-batch: bf16 rounds each product, so only near the fp32 step."""
    generator = torch.Generator().manual_seed(2)
    batches = [(torch.randn(16, 6, generator=generator), torch.randint(0, 4, (16,)))]
    big, micro = mlp(), mlp()
    steps_of(big, "sgd", "bf16", 1, batches)
    steps_of(micro, "sgd", "bf16", 4, batches)
    for mine, theirs in zip(micro.parameters(), big.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=2e-2, atol=2e-3)


def test_the_plan_counts_optimizer_steps_of_k_micro_batches():
    spec = parse_spec({**BASE, "batch_size": 25, "accumulate": 4})
    plan = Plan.of(spec, num_train=1437, world_size=2)
    # 1437 // (25 × 4 × 2) = 7 optimizer steps an epoch, each of 200 samples.
    assert (plan.steps_per_epoch, plan.global_batch_size, plan.step_batch_size) == (7, 200, 100)
    assert (plan.batch_size, plan.accumulate) == (25, 4)
    with pytest.raises(UserError, match="batch_size 25 × accumulate 4 × 2 workers is larger"):
        Plan.of(spec, num_train=150, world_size=2)


def test_accumulate_is_checked_and_refused_where_a_strategy_has_its_own():
    assert parse_spec(BASE).accumulate == 1
    for strategy in ({"name": "single"}, {"name": "ddp"}, {"name": "tensor"}):
        assert parse_spec({**BASE, "accumulate": 4, "strategy": strategy}).accumulate == 4
    with pytest.raises(UserError, match=r"accumulate: Input should be greater than 0 \(got 0\)"):
        parse_spec({**BASE, "accumulate": 0})
    for name, why in (
        ("ps", "ps workers accumulate gradients with mode downpour's n_push"),
        ("pipeline", "pipeline already accumulates over strategy.microbatches"),
        ("hybrid", "hybrid already accumulates over strategy.microbatches"),
    ):
        with pytest.raises(UserError) as caught:
            parse_spec({**BASE, "accumulate": 2, "strategy": {"name": name}})
        message = str(caught.value)
        assert "\n" not in message and "for strategies single, ddp and tensor" in message
        assert why in message
    # accumulate: 1 is every strategy's default, refused by none.
    assert parse_spec({**BASE, "accumulate": 1, "strategy": {"name": "ps"}}).accumulate == 1


def test_the_spec_hash_keeps_earlier_runs_and_tells_k_apart():
    plain = parse_spec(BASE)
    assert parse_spec({**BASE, "accumulate": 1}).spec_hash() == plain.spec_hash()
    assert parse_spec({**BASE, "accumulate": 2}).spec_hash() != plain.spec_hash()


def test_a_specs_accumulation_reaches_the_scaling_prediction(tmp_path):
    """`dlscale profile SPEC --devices 2`: the spec's K reaches the ddp point (one all-reduce a
    step over 2 × 4 × 32 samples) and the tensor point (one group's 4 × 32), and the
    strategies that refuse K are left out."""
    import yaml

    from dlscale.api.profiling import profile
    from dlscale.profiler.request import ProfileRequest, ScalingRequest

    spec = {**base_spec("acc", {"name": "digits"}), "batch_size": 32, "accumulate": 4}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**spec, "model": {"name": "mlp"}}))
    result = profile(ProfileRequest(str(path), hardware=("a100-40gb",)), ScalingRequest((2,)))
    (report,) = result.scaling
    ddp, tensor = [row.point for row in report.rows]
    assert (ddp.strategy, ddp.global_batch, ddp.detail["accumulate"]) == ("ddp", 256, 4)
    assert (tensor.strategy, tensor.global_batch, tensor.detail["accumulate"]) == ("tensor", 128, 4)
    assert result.workload.accumulate == 4


def test_fp16_loss_scaling_scales_each_micro_batch_and_steps_once():
    """GradScaler on the CPU (torch's own, as on a GPU): each micro-batch's loss is scaled, the
    gradients are unscaled once before the one update, and the scaler counts optimizer steps
    (its growth tracker: 3 clean steps, not 12 micro-batches)."""
    generator = torch.Generator().manual_seed(3)
    batches = [(torch.randn(16, 6, generator=generator), torch.randint(0, 4, (16,)))] * 3
    big, micro = mlp(), mlp()
    big_step, _ = steps_of(big, "sgd", "fp16", 1, batches)
    micro_step, _ = steps_of(micro, "sgd", "fp16", 4, batches)
    assert micro_step.scaler._get_growth_tracker() == big_step.scaler._get_growth_tracker() == 3
    assert micro_step.scaler.get_scale() == big_step.scaler.get_scale() == 2.0**16
    for mine, theirs in zip(micro.parameters(), big.parameters(), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=2e-2, atol=2e-3)
