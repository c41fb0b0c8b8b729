"""Seeded, resumable, shardable batches: the same global batches whatever the worker count."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


class GlobalBatchSampler(Sampler[torch.Tensor | list[int]]):
    """Yields this worker's share of each global batch of one epoch.

    Epoch e shuffles all sample indices with a generator seeded by (seed, e), cuts the permutation
    into global batches of `batch_size × world_size` and drops the last partial one (so every worker
    runs the same number of steps). Worker `rank` takes slice [rank·B, (rank+1)·B) of each global
    batch, so N workers at batch B see exactly the samples one process sees at batch N·B, and a
    resumed run (`start_batch`) sees exactly the batches an uninterrupted one would.

    Batches are index tensors, so `TensorDataset[batch]` is one gather (a Python list of 64 ints
    costs ~80 µs a batch to convert, measured by benchmarks/loop_overhead.py's profile); with
    `as_lists` they are lists, which pickle cheaply to DataLoader worker processes.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        as_lists: bool = False,
    ):
        assert 0 <= rank < world_size
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.shuffle = shuffle
        self.as_lists = as_lists
        self.epoch = 0
        self.start_batch = 0

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.world_size

    @property
    def batches_per_epoch(self) -> int:
        return self.num_samples // self.global_batch_size

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Select the epoch's permutation and how many of its batches are already done."""
        self.epoch = epoch
        self.start_batch = start_batch

    def _order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)
        # One generator per epoch, independent of the global RNG (which dropout uses).
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def __iter__(self) -> Iterator[torch.Tensor | list[int]]:
        order = self._order()
        global_batch = self.global_batch_size
        for b in range(self.start_batch, self.batches_per_epoch):
            start = b * global_batch + self.rank * self.batch_size
            batch = order[start : start + self.batch_size]
            yield batch.tolist() if self.as_lists else batch

    def __len__(self) -> int:
        return self.batches_per_epoch - self.start_batch
