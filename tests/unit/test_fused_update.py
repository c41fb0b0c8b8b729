"""A CPU trainer's update runs as torch's fused kernel (train/step.py build_optimizer): chosen
for plain CPU tensors only, kept across a checkpoint's load, left for torch's loop when a
gradient is sparse, and equal to the loop's result."""

import pytest
import torch
from torch import nn

from dlscale.jobspec import OptimizerSpec
from dlscale.train.step import build_optimizer

NAMES = ("sgd", "momentum", "adam", "adamw", "adagrad")


def _trained(name: str, fused: bool, steps: int = 5) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = build_optimizer(model.parameters(), OptimizerSpec(name=name, lr=0.01))
    for group in optimizer.param_groups:  # the loop, as torch runs a CPU update by default
        group["fused"] = fused
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        model(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", NAMES)
def test_every_optimizer_is_fused_on_a_cpu_and_matches_torchs_loop(name):
    model = nn.Linear(4, 2)
    optimizer = build_optimizer(model.parameters(), OptimizerSpec(name=name))
    assert all(group["fused"] for group in optimizer.param_groups)
    for fused, loop in zip(_trained(name, True), _trained(name, False), strict=True):
        torch.testing.assert_close(fused, loop, rtol=1e-5, atol=1e-6)


def test_tensors_the_fused_kernels_refuse_keep_torchs_default():
    with torch.device("meta"):
        model = nn.Linear(4, 2)
    optimizer = build_optimizer(model.parameters(), OptimizerSpec(name="adam"))
    assert not optimizer.param_groups[0]["fused"]
    # groups of parameters (a tensor-parallel trainer's) are looked into, not taken as tensors
    cpu = nn.Linear(4, 2)
    groups = [{"params": [cpu.weight]}, {"params": [cpu.bias]}]
    optimizer = build_optimizer(groups, OptimizerSpec(name="adam"))
    assert all(group["fused"] for group in optimizer.param_groups)
    integer = torch.zeros(3, dtype=torch.int64)
    assert not build_optimizer([integer], OptimizerSpec(name="sgd")).param_groups[0]["fused"]


def test_loading_a_checkpoint_keeps_the_fused_update():
    model = nn.Linear(4, 2)
    old = torch.optim.Adam(model.parameters())  # saved before dlscale fused the CPU update
    model(torch.randn(3, 4)).sum().backward()
    old.step()
    saved = old.state_dict()
    assert saved["param_groups"][0]["fused"] is None
    optimizer = build_optimizer(model.parameters(), OptimizerSpec(name="adam"))
    optimizer.load_state_dict(saved)
    assert optimizer.param_groups[0]["fused"] is True
    assert optimizer.param_groups[0]["foreach"] is None
    optimizer.step()  # the saved state steps under the fused kernel
    assert int(optimizer.state[model.weight]["step"]) == 2


def test_a_fused_runs_checkpoint_does_not_fuse_an_optimizer_built_unfused():
    """A CPU run's checkpoint resumed where torch's default runs (a GPU; here meta tensors,
    which the fused kernels refuse too): its saved `fused: True` is not taken."""
    model = nn.Linear(4, 2)
    cpu = build_optimizer(model.parameters(), OptimizerSpec(name="adam"))
    model(torch.randn(3, 4)).sum().backward()
    cpu.step()
    saved = cpu.state_dict()
    assert saved["param_groups"][0]["fused"] is True
    with torch.device("meta"):
        elsewhere = nn.Linear(4, 2)
    optimizer = build_optimizer(elsewhere.parameters(), OptimizerSpec(name="adam"))
    optimizer.load_state_dict(saved)
    assert optimizer.param_groups[0]["fused"] is None
    assert optimizer.param_groups[0]["foreach"] is None


def test_groups_given_as_generators_train_every_parameter():
    model = nn.Linear(4, 2)
    optimizer = build_optimizer([{"params": model.parameters()}], OptimizerSpec(name="sgd"))
    assert optimizer.param_groups[0]["fused"] and len(optimizer.param_groups[0]["params"]) == 2


def test_a_gradient_laid_out_unlike_its_parameter_leaves_the_fused_kernel():
    """torch's fused CPU kernels read a gradient as if laid out like its parameter: a transposed
    gradient assigned by hand would update the wrong elements. The step uses torch's loop."""
    weight = nn.Parameter(torch.zeros(3, 2))
    optimizer = build_optimizer([weight], OptimizerSpec(name="sgd", lr=1.0))
    gradient = torch.arange(6.0).reshape(2, 3)
    weight.grad = gradient.t()  # the right values, another layout
    optimizer.step()
    assert not optimizer.param_groups[0]["fused"]
    torch.testing.assert_close(weight.detach(), -gradient.t())


@pytest.mark.parametrize("name", ("sgd", "adagrad"))
def test_a_sparse_gradient_leaves_the_fused_kernel_for_torchs_loop(name):
    embedding = nn.Embedding(10, 4, sparse=True)
    optimizer = build_optimizer(embedding.parameters(), OptimizerSpec(name=name, lr=0.1))
    assert optimizer.param_groups[0]["fused"]
    before = embedding.weight.detach().clone()
    embedding(torch.tensor([1, 2])).sum().backward()
    optimizer.step()  # torch's fused kernels raise on a sparse gradient
    assert not optimizer.param_groups[0]["fused"]
    changed = (embedding.weight != before).any(dim=1)
    assert changed.tolist() == [i in (1, 2) for i in range(10)]
