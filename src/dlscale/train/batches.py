"""A trainer's batches: its slice of every global batch, gathered in this process or by
DataLoader worker processes, and the validation loader."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.utils.data import DataLoader, TensorDataset

from dlscale.spec import Spec
from dlscale.train.sampler import GlobalBatchSampler


class InProcessBatches:
    """The sampler's batches gathered in this process: what DataLoader does with no workers."""

    def __init__(self, dataset: TensorDataset, sampler: GlobalBatchSampler):
        self.dataset = dataset
        self.sampler = sampler

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for index in self.sampler:
            yield self.dataset[index]

    def __len__(self) -> int:
        return len(self.sampler)


def train_batches(
    spec: Spec, dataset: TensorDataset, sampler: GlobalBatchSampler, device: torch.device
) -> Iterable:
    """Batches are fetched whole (`dataset[index_tensor]`), never sample by sample.

    With no worker processes and no pinning, DataLoader has nothing to add and costs ~80 µs
    a step (benchmarks/loop_overhead.py), so the sampler's batches are gathered directly.
    """
    loader = spec.loader
    pin = loader.pin_memory and device.type == "cuda"
    if loader.workers == 0 and not pin:
        return InProcessBatches(dataset, sampler)
    extra = {}
    if loader.workers > 0:
        extra = {"persistent_workers": True, "prefetch_factor": loader.prefetch or 2}
    return DataLoader(
        dataset,
        sampler=sampler,
        batch_size=None,
        num_workers=loader.workers,
        pin_memory=pin,
        # Its own generator: creating an iterator must not draw from the global RNG.
        generator=torch.Generator().manual_seed(spec.seed),
        **extra,
    )


def val_batches(spec: Spec, dataset: TensorDataset) -> DataLoader:
    return DataLoader(dataset, batch_size=max(256, spec.batch_size))
