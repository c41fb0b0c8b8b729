"""The contract of a streamed data set: it yields each rank's batches of an epoch itself.

A stream cannot be indexed (WebDataset shards are read front to back), so instead of the loop's
index sampler it answers `batches(...)`: this rank's batches of one epoch, from `start_batch` on,
exactly `batches_per_epoch(...) - start_batch` of them when training. Ranks share an epoch's
samples without overlap; the order is a pure function of (seed, epoch, rank), so a run resumed
at any batch sees what an uninterrupted one would. `part=(w, W)` is DataLoader worker w of W:
it yields only the batches b with (b - start_batch) % W == w, which DataLoader's round-robin
puts back in order.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class StreamDataset:
    """Base of streamed data sets (see the module docstring)."""

    streamed = True

    def __len__(self) -> int:
        """Samples in one epoch of this part (training or validation), all ranks together."""
        raise NotImplementedError

    def batches_per_epoch(self, batch_size: int, world: int) -> int:
        """Steps every rank runs per epoch (the last partial global batch is dropped)."""
        return len(self) // (batch_size * world)

    def example(self, count: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """The first `count` samples as (x, y) batches: the shape and type a model is built for."""
        raise NotImplementedError

    def batches(
        self,
        epoch: int,
        start_batch: int,
        batch_size: int,
        rank: int = 0,
        world: int = 1,
        part: tuple[int, int] = (0, 1),
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """This rank's `(x, y, io)` batches (see `dlscale.data.lazy.IO_FIELDS` for io).

        Validation reads with shuffle=False, drop_last=False, rank 0 of 1: every sample once.
        """
        raise NotImplementedError

    def position(self, epoch: int, batch: int, batch_size: int, rank: int, world: int) -> dict:
        """Where this rank's batch `batch` of `epoch` starts in the files: {"shard", "index"}."""
        raise NotImplementedError

    def files(self) -> list[str]:
        """Every file this data set reads (for staging and for messages)."""
        raise NotImplementedError
