"""The pure parts of `dlscale bench`: its FLOP counts, the cache sizes sysfs writes, the
per-sample dataset and the timing of an optimizer update (tests/cli/test_bench.py measures)."""

import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from dlscale.bench.loader import PerSampleDataset
from dlscale.bench.machine import parse_cache_size
from dlscale.bench.matmul import matmul_flops
from dlscale.bench.width import parameter_count, step_matmul_flops
from dlscale.models import build_model
from dlscale.profiler.calibrate import update_seconds_in_step
from dlscale.train.score import compute_loss

MiB = 2**20


def test_flop_counts_match_torch_flop_counter():
    a = torch.randn(24, 24)
    with FlopCounterMode(display=False) as counter:
        torch.mm(a, a)
    assert counter.get_total_flops() == matmul_flops(24)

    model = build_model("mlp", {"input_size": 20, "hidden": [16, 16], "num_classes": 10})
    x, y = torch.randn(4, 20), torch.randint(10, (4,))
    with FlopCounterMode(display=False) as counter:
        compute_loss(model(x), y).backward()
    assert counter.get_total_flops() == step_matmul_flops(16, batch_size=4, input_size=20)
    assert sum(p.numel() for p in model.parameters()) == parameter_count(16, input_size=20)


def test_cache_sizes_parse_as_sysfs_writes_them():
    assert parse_cache_size("48K\n") == 48 * 1024
    assert parse_cache_size("32M") == 32 * MiB
    assert parse_cache_size("1024") == 1024


class _SlowForward(torch.nn.Linear):
    """A linear layer whose forward takes 20 ms, and which counts its forwards."""

    forwards = 0

    def forward(self, x):
        self.forwards += 1
        time.sleep(0.02)
        return super().forward(x)


def test_optimizer_updates_are_timed_inside_training_steps():
    model = _SlowForward(4, 4)
    before = model.weight.detach().clone()
    seconds = update_seconds_in_step(model, torch.randn(2, 4), torch.device("cpu"), 0.0)
    # Each update follows a forward and a backward (fresh gradients), but only the update is
    # timed: Adam over 20 numbers takes microseconds, the forward 20 ms.
    assert model.forwards >= 3 + 5
    assert not torch.equal(model.weight.detach(), before)
    assert 0 < seconds < 0.02


def test_per_sample_dataset_batches_like_the_tensors_it_wraps():
    images = torch.rand(10, 3, 8, 8)
    labels = torch.arange(10)
    dataset = PerSampleDataset(torch.utils.data.TensorDataset(images, labels))
    for index in (torch.tensor([7, 2, 5]), [7, 2, 5]):
        x, y = dataset[index]
        assert x.shape == (3, 3, 8, 8) and x.dtype == torch.float32
        assert y.tolist() == [7, 2, 5]
    assert dataset[4][0].shape == (3, 8, 8) and int(dataset[4][1]) == 4
    features = torch.rand(10, 5)  # not images: read per sample, but not augmented
    plain = PerSampleDataset(torch.utils.data.TensorDataset(features, labels))
    assert torch.equal(plain[[1, 3]][0], features[[1, 3]])
