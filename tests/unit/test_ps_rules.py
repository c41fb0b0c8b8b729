"""The parameter servers' update rules, as pure functions: milliseconds, no processes."""

import pytest
import torch

from dlscale.strategies.ps import rules
from dlscale.strategies.ps.layout import FlatShards, shard_parameters


def test_staleness_and_its_learning_rate_scale():
    assert rules.staleness(server_version=7, computed_from=4) == 3
    assert rules.staleness_lr_scale(3, scaled=True) == pytest.approx(0.25)
    assert rules.staleness_lr_scale(3, scaled=False) == 1.0
    assert rules.staleness_lr_scale(0, scaled=True) == 1.0


def test_the_stale_synchronous_bound_holds_back_only_a_worker_too_far_ahead():
    clock = {2: 5, 3: 3, 4: 4}
    assert rules.ssp_must_wait(clock, 2, live=[2, 3, 4], bound=1)  # 5 − 3 > 1
    assert not rules.ssp_must_wait(clock, 2, live=[2, 3, 4], bound=2)
    assert not rules.ssp_must_wait(clock, 2, live=[2, 4], bound=1)  # 3 is gone: 5 − 4
    assert not rules.ssp_must_wait(clock, 2, live=[2, 3, 4], bound=None)
    assert not rules.ssp_must_wait(clock, 2, live=[2], bound=0)  # alone: never waits
    assert rules.clock_gap(clock, [2, 3, 4]) == 2 and rules.clock_gap(clock, []) == 0


def test_an_averaging_round_ends_when_every_live_worker_has_sent():
    assert not rules.round_complete({2}, live=[2, 3])
    assert rules.round_complete({2, 3}, live=[2, 3])
    assert rules.round_complete({2}, live=[2])  # 3 died mid-round
    assert [rules.averaging_due(step, 4) for step in range(1, 9)] == [False] * 3 + [True] + [
        False
    ] * 3 + [True]


def test_downpour_pushes_every_n_push_and_fetches_every_n_fetch_but_not_at_the_end():
    actions = []
    accumulated = 0
    for step in range(1, 9):
        accumulated += 1
        push, fetch = rules.downpour_actions(step, accumulated, n_push=2, n_fetch=4, last_step=8)
        actions.append((push, fetch))
        accumulated = 0 if push else accumulated
    assert actions == [
        (False, False),
        (True, False),
        (False, False),
        (True, True),
        (False, False),
        (True, False),
        (False, False),
        (True, False),
    ]
    # async is downpour with n_push = n_fetch = 1: push and fetch every step but the last
    assert rules.downpour_actions(3, 1, 1, 1, last_step=5) == (True, True)
    assert rules.downpour_actions(5, 1, 1, 1, last_step=5) == (True, False)


def test_a_server_update_is_the_optimizer_on_the_shard_at_the_scaled_rate():
    flat = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    optimizer = torch.optim.SGD([flat], lr=0.5)
    rules.apply_gradient(flat, torch.tensor([1.0, -2.0]), optimizer, [0.5], lr_scale=0.5)
    assert torch.equal(flat.detach(), torch.tensor([0.75, 2.5]))  # lr 0.25
    assert flat.grad is None and optimizer.param_groups[0]["lr"] == 0.25
    rules.apply_gradient(flat, torch.tensor([1.0, 0.0]), optimizer, [0.5], lr_scale=1.0)
    assert torch.equal(flat.detach(), torch.tensor([0.25, 2.5]))  # back at the base lr


def test_a_workers_tensors_are_views_of_its_flat_shard_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    sizes = [p.numel() for p in model.parameters()]  # 12, 4, 8, 2
    shards = shard_parameters(sizes, 2)
    buffers = FlatShards(model, shards, torch.device("cpu"))
    assert [b.numel() for b in buffers.host_params] == [sum(sizes[i] for i in s) for s in shards]
    buffers.host_params[0].fill_(1.0)  # a pull lands straight in the model
    first = next(iter(model.parameters()))
    assert shards[0][0] == 0 and torch.equal(first.detach(), torch.ones(4, 3))
    model(torch.ones(1, 3)).sum().backward()  # backward writes where a push reads
    assert buffers.host_grads[0].abs().sum() > 0
    buffers.zero_grads()
    assert all(float(g.abs().sum()) == 0.0 for g in buffers.host_grads)
