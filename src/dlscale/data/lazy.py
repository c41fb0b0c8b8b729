"""Data read from disk while training: samples fetched a batch at a time, never the whole set.

Two shapes share one contract with the training loop. A `LazyDataset` is map-style (a Hugging
Face Arrow table, a folder of images): `dataset[indices]` reads and decodes that batch, so the
seeded `GlobalBatchSampler` shards, orders and resumes it exactly as it does tensors in memory. A
stream (WebDataset shards) yields its batches itself: see `dlscale.data.stream`.

Every batch read from disk comes as `(x, y, io)`: `io` is a float64 tensor of `IO_FIELDS`, the
seconds this batch took to read and to decode, and how many bad samples it skipped, which the loop
adds up so a starving warning can name its cause.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from dlscale.errors import UserError, one_line

IO_FIELDS = ("read_s", "decode_s", "bad_samples", "read_bytes", "samples")


class DataError(UserError):
    """A file or sample that cannot be read: one line naming it and what was expected.

    Raised in a DataLoader worker, torch re-raises it in the trainer with the worker's traceback
    folded into the message; the original line is taken back out of it.
    """

    def __init__(self, message: str, exit_code: int = 2):
        if "Original Traceback" in message:  # torch's ExceptionWrapper.reraise()
            lines = [line for line in message.splitlines() if line.strip()]
            message = lines[-1].split("DataError: ", 1)[-1]
        super().__init__(message, exit_code)


def io_stats(read_s=0.0, decode_s=0.0, bad=0, read_bytes=0, samples=0) -> torch.Tensor:
    return torch.tensor([read_s, decode_s, bad, read_bytes, samples], dtype=torch.float64)


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """A decoded sample as the model takes it: uint8 images become float32 in [0, 1]."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    if tensor.dtype == torch.uint8:
        return tensor.float().div_(255.0)
    if tensor.is_floating_point():
        return tensor.float()
    return tensor.long()


class LazyDataset(Dataset):
    """Map-style data on disk. Subclasses say how to read one sample and how to decode it."""

    def __init__(self, length: int, skip_bad: bool = False):
        self.length = length
        self.skip_bad = skip_bad

    # ------------------------------------------------------------ subclasses

    def read(self, index: int) -> tuple[Any, int]:
        """The raw sample at `index` and the bytes read for it (timed as reading)."""
        raise NotImplementedError

    def decode(self, raw: Any, index: int) -> tuple[torch.Tensor, torch.Tensor | int]:
        """(input, label) from the raw sample (timed as decoding); raise on a bad sample."""
        raise NotImplementedError

    def where(self, index: int) -> str:
        """The file (and position) a sample comes from, for error messages."""
        raise NotImplementedError

    def files(self) -> list[str]:
        """Every file this data set reads (for staging, `bench io` and messages)."""
        raise NotImplementedError

    # ------------------------------------------------------------- contract

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int | Sequence[int] | torch.Tensor):
        """One sample `(x, y)` for an int; `(x, y, io)` batches for a list or index tensor."""
        if isinstance(index, int | np.integer):
            x, y, _ = self._batch([int(index)])
            return x[0], y[0]
        indices = index.tolist() if isinstance(index, torch.Tensor) else list(index)
        return self._batch(indices)

    def example(self, count: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, _ = self._batch(list(range(min(count, self.length))))
        return x, y

    def _batch(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        xs, ys = [], []
        read_s = decode_s = 0.0
        bad = read_bytes = 0
        for index in indices:
            t0 = time.perf_counter()
            try:
                raw, size = self.read(index)
                t1 = time.perf_counter()
                x, y = self.decode(raw, index)
            except Exception as error:  # a sample that does not read or decode
                if isinstance(error, DataError) and not self.skip_bad:
                    raise  # already names the file and what was expected
                if not self.skip_bad:
                    raise DataError(
                        f"{self.where(index)}: cannot read sample {index}: "
                        f"{type(error).__name__}: {one_line(str(error)) or 'no detail'} "
                        "(data.skip_bad: true skips and counts such samples)"
                    ) from None
                bad += 1
                continue
            t2 = time.perf_counter()
            read_s += t1 - t0
            decode_s += t2 - t1
            read_bytes += size
            xs.append(x)
            ys.append(torch.as_tensor(y))
        if not xs:
            raise DataError(
                f"{self.where(indices[0])}: every sample of a batch of {len(indices)} is bad"
            )
        io = io_stats(read_s, decode_s, bad, read_bytes, len(xs))
        return torch.stack(xs), torch.stack(ys).long(), io
