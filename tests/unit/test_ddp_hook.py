"""How dlscale's ddp wraps a worker's model (train/ddp_hook.wrap): its gradients are DDP's
buckets, one copy of them, not a second copy beside the buckets."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from dlscale.train.ddp_hook import AllreduceTimer, wrap


def _one_step_in_a_group(store_path: str, queue) -> None:
    """A one-process gloo group: a step of a wrapped model and of its plain twin; reports the
    gradients' storages and whether both models' gradients and weights agree."""
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 1), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        twin = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        twin.load_state_dict(plain.state_dict())
        timer = AllreduceTimer(1)
        model = wrap(twin, timer)
        x, y = torch.randn(5, 8), torch.randint(0, 4, (5,))
        storages = []
        for net in (plain, model):
            optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
            for _ in range(3):
                optimizer.zero_grad(set_to_none=True)
                nn.functional.cross_entropy(net(x), y).backward()
                optimizer.step()
            storages.append({p.grad.untyped_storage().data_ptr() for p in net.parameters()})
        same = all(
            torch.allclose(a, b) and torch.allclose(a.grad, b.grad)
            for a, b in zip(plain.parameters(), twin.parameters(), strict=True)
        )
        queue.put((len(storages[0]), len(storages[1]), same, timer.allreduces))
    finally:
        model.reducer = None  # before the group goes down (strategies/ddp.py says why)
        dist.destroy_process_group()


def test_a_ddp_workers_gradients_are_its_buckets_and_train_as_the_plain_model(tmp_path: Path):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_one_step_in_a_group, args=(str(tmp_path / "store"), queue))
    child.start()
    plain_storages, ddp_storages, same, allreduces = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    # The plain model's 4 tensors each hold their gradient; under DDP all 4 are views of its one
    # bucket (torch's default would keep 4 gradients and a bucket beside them).
    assert plain_storages == 4 and ddp_storages == 1
    # A group of one changes nothing: the same gradients and weights after 3 steps, each step
    # one bucket all-reduced.
    assert same and allreduces == 3
