"""A trainer's batches: its slice of every global batch, gathered in this process or by
DataLoader worker processes, and the validation loader."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
    get_worker_info,
)

from dlscale.data.stream import StreamDataset
from dlscale.jobspec import Spec
from dlscale.signals import end_with_parent
from dlscale.train.sampler import GlobalBatchSampler


class InProcessBatches:
    """The sampler's batches gathered in this process: what DataLoader does with no workers.

    `pin_memory` (a TensorDataset on CUDA): each batch is gathered straight into page-locked
    memory, where DataLoader would gather it into pageable memory and copy it again to pin it.
    torch's caching host allocator hands a pinned block out again only after the copies that
    read it have finished, so a fresh tensor per batch is safe with non-blocking copies."""

    def __init__(self, dataset: TensorDataset, sampler: GlobalBatchSampler, pin: bool = False):
        self.dataset = dataset
        self.sampler = sampler
        self.pin_memory = pin

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        for index in self.sampler:
            if self.pin_memory:
                yield tuple(gather_pinned(t, index) for t in self.dataset.tensors)
            else:
                yield self.dataset[index]

    def __len__(self) -> int:
        return len(self.sampler)


def gather_pinned(tensor: torch.Tensor, index) -> torch.Tensor:
    """tensor[index] along its first dimension, written into a new page-locked tensor."""
    index = torch.as_tensor(index)
    out = torch.empty((len(index), *tensor.shape[1:]), dtype=tensor.dtype, pin_memory=True)
    return torch.index_select(tensor, 0, index, out=out)


class StreamSampler(GlobalBatchSampler):
    """The index sampler's epoch bookkeeping (steps per epoch, the epoch and batch to start
    at) for a stream, which picks and reads its own samples: `batches()` instead of indices."""

    def __init__(self, source: StreamDataset, batch_size: int, rank: int = 0, world: int = 1):
        super().__init__(len(source), batch_size, seed=0, rank=rank, world_size=world)
        self.source = source

    def batches(self, part: tuple[int, int] = (0, 1)) -> Iterator:
        return self.source.batches(
            self.epoch, self.start_batch, self.batch_size, self.rank, self.world_size, part
        )

    def __iter__(self):
        raise TypeError("a stream yields its own batches: iterate StreamBatches")


class _StreamPart(IterableDataset):
    """In DataLoader worker w of W: the stream's batches that are worker w's."""

    def __init__(self, sampler: StreamSampler):
        self.sampler = sampler

    def __iter__(self) -> Iterator:
        info = get_worker_info()
        part = (info.id, info.num_workers) if info is not None else (0, 1)
        return self.sampler.batches(part)


def end_with_trainer(worker_id: int) -> None:
    """A loader worker's first act: end the moment its trainer does. A forked worker holds a
    copy of every open file, the run folder's lock among them, and torch's own check of its
    parent runs every 5 s, so a --resume straight after a SIGKILL found the folder 'in use'."""
    end_with_parent()


def own_generator(seed: int) -> torch.Generator:
    """A DataLoader's own generator. Without one, each `iter(loader)` draws the workers' base
    seed from torch's global generator: the very stream dropout draws from, so a resumed run,
    which starts its loader mid-epoch, would shift every later dropout mask."""
    return torch.Generator().manual_seed(seed)


class StreamBatches:
    """A stream's batches of the sampler's epoch: read here, or by loader worker processes
    (started for each epoch, since the epoch and start batch change what they read)."""

    def __init__(
        self, sampler: StreamSampler, workers: int, prefetch: int | None, pin: bool, seed: int
    ):
        self.sampler = sampler
        self.workers = workers
        self.prefetch = prefetch
        self.pin_memory = pin
        self.seed = seed

    def __iter__(self) -> Iterator:
        if self.workers == 0 and not self.pin_memory:
            return self.sampler.batches()
        extra = {"prefetch_factor": self.prefetch or 2} if self.workers else {}
        loader = DataLoader(
            _StreamPart(self.sampler),
            batch_size=None,
            num_workers=self.workers,
            pin_memory=self.pin_memory,
            generator=own_generator(self.seed * 1_000_003 + self.sampler.epoch),
            worker_init_fn=end_with_trainer,
            **extra,
        )
        return iter(loader)

    def __len__(self) -> int:
        return len(self.sampler)


class _WholeStream(IterableDataset):
    """Every sample of a stream once, in file order: validation."""

    def __init__(self, source: StreamDataset, batch_size: int):
        self.source = source
        self.batch_size = batch_size

    def __iter__(self) -> Iterator:
        return self.source.batches(0, 0, self.batch_size, shuffle=False, drop_last=False)


def train_batches(spec: Spec, dataset, sampler, device: torch.device) -> Iterable:
    """Batches are fetched whole (`dataset[index_tensor]`), never sample by sample; a stream
    yields its own (`sampler` is then a StreamSampler).

    With no worker processes, DataLoader has nothing to add and costs ~80 µs a step
    (benchmarks/loop_overhead.py), so the sampler's batches are gathered directly (into pinned
    memory on CUDA, unless the spec says not to pin).
    """
    loader = spec.loader
    pin = loader.pinned_on(device.type)
    if isinstance(sampler, StreamSampler):
        return StreamBatches(sampler, loader.workers, loader.prefetch, pin, spec.seed)
    if loader.workers == 0 and (not pin or isinstance(dataset, TensorDataset)):
        return InProcessBatches(dataset, sampler, pin)
    extra = {}
    if loader.workers > 0:
        extra = {"persistent_workers": True, "prefetch_factor": loader.prefetch or 2}
    return DataLoader(
        dataset,
        sampler=sampler,
        batch_size=None,
        num_workers=loader.workers,
        pin_memory=pin,
        generator=own_generator(spec.seed),
        worker_init_fn=end_with_trainer,
        **extra,
    )


def val_batches(spec: Spec, dataset) -> Iterable:
    """Every validation sample once, in order, in batches of at least 256."""
    size = max(256, spec.batch_size)
    generator = own_generator(spec.seed)  # validating must not move the training RNG either
    if isinstance(dataset, TensorDataset):
        return DataLoader(dataset, batch_size=size, generator=generator)
    if getattr(dataset, "streamed", False):
        return DataLoader(_WholeStream(dataset, size), batch_size=None, generator=generator)
    # Data read from disk: a batch of indices at a time, decoded by the loader's workers.
    batches = BatchSampler(SequentialSampler(dataset), size, drop_last=False)
    workers = spec.loader.workers
    extra = {"persistent_workers": True} if workers else {}
    return DataLoader(
        dataset,
        sampler=batches,
        batch_size=None,
        num_workers=workers,
        generator=generator,
        worker_init_fn=end_with_trainer,
        **extra,
    )
