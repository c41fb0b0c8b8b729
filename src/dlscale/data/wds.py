"""WebDataset shards as a stream: each rank reads its own range of an epoch, front to back.

An epoch reads the shards in a seeded order (`dlscale.data.stream_order`); rank r of `world`
reads only its contiguous range of that sequence, and a shuffle buffer, simulated on sample
positions, says when each sample is emitted. A reader reads only the samples its batches need,
seeking over the others without decoding them, and holds in memory only those read but not yet
emitted (at most the buffer and one batch): never a shard, never the data set.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from dlscale.data import stream_order as order_of
from dlscale.data.bundle import DataBundle
from dlscale.data.lazy import DataError, io_stats
from dlscale.data.shards import (
    ShardIndex,
    expand_pattern,
    listed_shards,
    read_manifest,
    sample_fields,
    scan_shard,
)
from dlscale.data.stream import StreamDataset
from dlscale.data.wds_sample import SampleDecoder
from dlscale.errors import one_line, os_reason
from dlscale.jobspec import WebDatasetData

SKIP_HINT = " (data.skip_bad: true skips and counts such samples)"


@dataclass
class _Raw:
    """One sample's bytes as read from its shard, with where it came from."""

    shard: str
    index: int  # within its shard
    chunk: bytes
    read_s: float


class WebDatasetStream(StreamDataset):
    """The training or validation part of a set of shards (see the module docstring)."""

    def __init__(
        self,
        shards: list[ShardIndex],
        keep: np.ndarray | None,  # (samples,) bool over file-order sample numbers; None: all
        decoder: SampleDecoder,
        seed: int,
        shuffle_buffer: int,
        skip_bad: bool,
    ):
        self.shards = shards
        self.keep = keep
        self.decoder = decoder
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.skip_bad = skip_bad
        counts = np.array([shard.count for shard in shards], dtype=np.int64)
        self.first_number = np.concatenate([[0], np.cumsum(counts)])  # of each shard's sample 0
        self.kept_counts = counts  # samples of each shard this part reads
        if keep is not None:
            bounds = zip(self.first_number[:-1], self.first_number[1:], strict=True)
            self.kept_counts = np.array([keep[a:b].sum() for a, b in bounds], dtype=np.int64)

    # ------------------------------------------------------------------ contract

    def __len__(self) -> int:
        return int(self.kept_counts.sum())

    def files(self) -> list[str]:
        return [shard.path for shard in self.shards]

    def example(self, count: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        positions = np.arange(min(count, len(self)))
        samples = self._read(0, positions, shuffle=False)
        x, y, _ = self._decode_batch([raw for _, raw in samples], 0.0, skip_bad=False)
        return x, y

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
        lo, hi = order_of.rank_range(len(self), batch_size, rank, world, drop_last)
        buffer = self.shuffle_buffer if shuffle else 0
        order = order_of.emission_order(hi - lo, buffer, self.seed, epoch, rank)
        total = order_of.num_batches(hi - lo, batch_size, drop_last)
        mine = [
            order[b * batch_size : (b + 1) * batch_size] + lo
            for b in range(start_batch + part[0], total, part[1])
        ]
        if not mine:
            return
        # Read in file order only what these batches need; hold each until its batch is due.
        reader = iter(self._read(epoch, np.sort(np.concatenate(mine)), shuffle))
        held: dict[int, _Raw] = {}
        for positions in mine:
            read_s = 0.0
            last = int(positions.max())  # read in ascending order: then all of it is held
            while last not in held:
                position, raw = next(reader)
                held[position] = raw
                read_s += raw.read_s
            yield self._decode_batch([held.pop(int(p)) for p in positions], read_s, self.skip_bad)

    def position(self, epoch: int, batch: int, batch_size: int, rank: int, world: int) -> dict:
        lo, hi = order_of.rank_range(len(self), batch_size, rank, world, drop_last=True)
        order = order_of.emission_order(hi - lo, self.shuffle_buffer, self.seed, epoch, rank)
        first = lo + order_of.first_unemitted(order, batch * batch_size)
        if first >= hi:  # the whole range emitted: the next epoch's rank start
            return self.position(epoch + 1, 0, batch_size, rank, world)
        (_, (shard, index)) = next(self._locate(epoch, np.array([first]), shuffle=True))
        return {"shard": self.shards[shard].path, "index": index}

    # ------------------------------------------------------------------- reading

    def _locate(
        self, epoch: int, positions: np.ndarray, shuffle: bool
    ) -> Iterator[tuple[int, tuple[int, int]]]:
        """(position, (shard, index within it)) of ascending epoch positions."""
        if len(positions) == 0:
            return
        shard_order = order_of.shard_order(len(self.shards), self.seed, epoch, shuffle)
        ends = np.cumsum(self.kept_counts[shard_order])  # epoch position after each shard
        slots = np.searchsorted(ends, positions, side="right")
        cuts = [0, *(np.flatnonzero(np.diff(slots)) + 1).tolist(), len(positions)]
        for first, stop in itertools.pairwise(cuts):  # the positions in one shard
            shard = int(shard_order[slots[first]])
            begin = int(ends[slots[first]] - self.kept_counts[shard])
            here = positions[first:stop]
            local = self._kept_indices(shard)[here - begin]
            for position, index in zip(here.tolist(), local.tolist(), strict=True):
                yield position, (shard, index)

    def _kept_indices(self, shard: int) -> np.ndarray:
        """The indices within a shard of the samples this part reads."""
        count = self.shards[shard].count
        if self.keep is None:
            return np.arange(count)
        first = self.first_number[shard]
        return np.flatnonzero(self.keep[first : first + count])

    def _read(self, epoch: int, positions: np.ndarray, shuffle: bool) -> Iterator[tuple[int, _Raw]]:
        """The raw samples at ascending positions, one shard open at a time."""
        file, path = None, None
        try:
            for position, (shard, index) in self._locate(epoch, positions, shuffle):
                if self.shards[shard].path != path:
                    if file is not None:
                        file.close()
                    path = self.shards[shard].path
                    file = self._open(path)
                begin, end = self.shards[shard].span(index)
                t0 = time.perf_counter()
                file.seek(begin)
                chunk = file.read(end - begin)
                read_s = time.perf_counter() - t0
                if len(chunk) != end - begin:
                    raise DataError(
                        f"{path}: truncated since it was indexed: sample {index} "
                        f"ends at byte {end}, the file earlier"
                    )
                yield position, _Raw(path, index, chunk, read_s)
        finally:
            if file is not None:
                file.close()

    @staticmethod
    def _open(path: str):
        try:
            return open(path, "rb")  # closed by _read as it moves on
        except OSError as error:
            detail = os_reason(error)
            raise DataError(f"{path}: cannot read shard: {detail}") from None

    def _decode_batch(self, samples: list[_Raw], read_s: float, skip_bad: bool):
        xs, ys = [], []
        t0 = time.perf_counter()
        for raw in samples:
            where = f"{raw.shard}: sample {raw.index}"
            try:
                key, fields = sample_fields(raw.chunk)
                where += f" (key {key})"
                x, y = self.decoder.decode(fields, where)
            except Exception as error:
                if skip_bad:
                    continue
                if isinstance(error, DataError):
                    raise DataError(str(error) + SKIP_HINT) from None
                raise DataError(
                    f"{where}: not a readable tar sample: {one_line(error)}" + SKIP_HINT
                ) from None
            xs.append(x)
            ys.append(y)
        decode_s = time.perf_counter() - t0
        if not xs:
            raise DataError(
                f"{samples[0].shard}: every sample of a batch of {len(samples)} "
                f"from sample {samples[0].index} on is bad"
            )
        read_bytes = sum(len(raw.chunk) for raw in samples)
        io = io_stats(read_s, decode_s, len(samples) - len(xs), read_bytes, len(xs))
        return torch.stack(xs), torch.stack(ys), io


def read_webdataset(spec: WebDatasetData, seed: int) -> DataBundle:
    """Index a spec's shards (headers only) and open them as streamed training and validation.

    Validation is `val_urls`, or `val_fraction` of the samples held out by the data seed. The
    task, classes and vocabulary come from the spec, else from dataset.json, else the labels'
    field (`target.npy`: language modelling).
    """
    train_shards, manifest = _index(spec.urls)
    decoder = SampleDecoder(image_size=tuple(spec.image_size) if spec.image_size else None)
    shared = {
        "decoder": decoder,
        "seed": seed,
        "shuffle_buffer": spec.shuffle_buffer,
        "skip_bad": spec.skip_bad,
    }
    if spec.val_urls:
        train = WebDatasetStream(train_shards, None, **shared)
        val = WebDatasetStream(_index(spec.val_urls)[0], None, **shared)
    else:
        total = sum(shard.count for shard in train_shards)
        held = order_of.held_out(total, spec.val_fraction, seed, spec.urls)
        train = WebDatasetStream(train_shards, ~held, **shared)
        val = WebDatasetStream(train_shards, held, **shared)
    x, y = train.example(1)  # the first sample: its shape is every sample's
    decoder.input_shape = tuple(x.shape[1:])
    task, num_classes, vocab_size = _facts(spec, manifest, x, y)
    decoder.num_classes, decoder.vocab_size = num_classes, vocab_size
    return DataBundle(train, val, num_classes, task, vocab_size, _input_shape=decoder.input_shape)


def _index(pattern: str) -> tuple[list[ShardIndex], dict]:
    """The indexed shards a pattern names, and their dataset.json ({} when there is none)."""
    files = expand_pattern(pattern)
    manifest = read_manifest(files[0]) or {}
    listed = listed_shards(manifest)
    shards = [scan_shard(path, listed.get(os.path.basename(path))) for path in files]
    if not any(shard.count for shard in shards):
        raise DataError(f"{pattern}: its {len(files)} shard(s) hold no samples")
    return shards, manifest


def _facts(spec: WebDatasetData, manifest: dict, x: torch.Tensor, y: torch.Tensor):
    """(task, num_classes, vocab_size) of the data; one line saying what to set when unknown."""
    where = f"{spec.urls}: "
    task = manifest.get("task") or ("language_modeling" if y.ndim > 1 else "classification")
    if task not in ("classification", "language_modeling") or (task == "language_modeling") != (
        y.ndim > 1
    ):
        raise DataError(
            f"{where}dataset.json says task {task!r}, but the labels have shape "
            f"{tuple(y.shape[1:])} (cls: classification; target.npy: "
            "language_modeling)"
        )
    tokens = not x.is_floating_point()
    vocab_size = manifest.get("vocab_size") or (
        spec.num_classes if task == "language_modeling" else None
    )
    if (tokens or task == "language_modeling") and vocab_size is None:
        raise DataError(
            f"{where}token samples need their vocabulary size: set data.num_classes "
            "to it, or vocab_size in dataset.json"
        )
    if task == "language_modeling":
        return task, int(vocab_size), int(vocab_size)
    num_classes = spec.num_classes or manifest.get("num_classes")
    if num_classes is None:
        raise DataError(
            f"{where}the number of classes is unknown: set data.num_classes "
            "(no dataset.json next to the shards gives it)"
        )
    return task, int(num_classes), (int(vocab_size) if tokens else None)
