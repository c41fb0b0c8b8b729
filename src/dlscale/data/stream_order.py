"""The order a stream is read in: each rank's samples of an epoch, and when each is emitted.

Everything here is a pure function of (seed, epoch, rank, world, batch size), so a run resumed
at any batch recomputes exactly the order an uninterrupted run followed. Samples are named by
their position in the epoch's sequence (the shards in the epoch's order, each in file order).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dlscale.data.holdout import num_val_samples

# Tags keep the random streams drawn from one seed apart (numpy's SeedSequence mixes them in).
_SHARD_ORDER, _BUFFER, _HOLD_OUT = 0, 1, 2


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order the shards are read in during `epoch`: a seeded permutation, or file order."""
    if not shuffle:
        return np.arange(num_shards)
    return np.random.default_rng([seed, _SHARD_ORDER, epoch]).permutation(num_shards)


def rank_range(
    total: int, batch_size: int, rank: int, world: int, drop_last: bool
) -> tuple[int, int]:
    """The contiguous positions [lo, hi) rank `rank` of `world` reads in an epoch.

    Training (drop_last): every rank gets the same whole number of batches, and the tail of
    the epoch that would not fill one global batch is not read at all. Otherwise the epoch is
    cut into `world` near-equal ranges that cover every sample.
    """
    if drop_last:
        per_rank = (total // (batch_size * world)) * batch_size
        return rank * per_rank, (rank + 1) * per_rank
    return rank * total // world, (rank + 1) * total // world


def num_batches(count: int, batch_size: int, drop_last: bool) -> int:
    return count // batch_size if drop_last else math.ceil(count / batch_size)


@functools.lru_cache(maxsize=8)  # an epoch's batches and every checkpoint ask for the same one
def emission_order(count: int, buffer_size: int, seed: int, epoch: int, rank: int) -> np.ndarray:
    """Positions 0..count-1 in the order a shuffle buffer of `buffer_size` samples emits them.

    The buffer is simulated on integers, as WebDataset's shuffle runs on samples: it fills with
    the first `buffer_size` arrivals; each later arrival replaces a seeded random one of them,
    which is emitted; at the end the rest leave in a seeded random order. So the sample emitted
    `t`-th has position at most `buffer_size + t`: a reader needs only that far ahead, and
    holds at most `buffer_size` samples read but not yet emitted.
    """
    buffer_size = min(buffer_size, count)
    if buffer_size <= 1:
        return _frozen(np.arange(count, dtype=np.int64))
    rng = np.random.default_rng([seed, _BUFFER, epoch, rank])
    picks = rng.integers(0, buffer_size, size=count - buffer_size).tolist()
    buffer = list(range(buffer_size))
    order = np.empty(count, dtype=np.int64)
    for t, slot in enumerate(picks):  # plain lists: ~10x faster than numpy scalar indexing
        order[t] = buffer[slot]
        buffer[slot] = buffer_size + t
    order[count - buffer_size :] = rng.permutation(np.array(buffer, dtype=np.int64))
    return _frozen(order)


def _frozen(order: np.ndarray) -> np.ndarray:
    """Read-only: the cached order is shared by every caller."""
    order.flags.writeable = False
    return order


def first_unemitted(order: np.ndarray, emitted: int) -> int:
    """The smallest position not among the first `emitted` of `order`: where a resume starts
    reading (positions before it were all consumed before the checkpoint)."""
    pending = np.ones(len(order), dtype=bool)
    pending[order[:emitted]] = False
    return int(np.argmax(pending)) if pending.any() else len(order)


def held_out(num_samples: int, val_fraction: float, seed: int, source: str) -> np.ndarray:
    """A boolean mask over sample numbers (file order) of the samples held out for validation.

    Seeded by the data seed and fixed across epochs, so training never reads them. Not
    stratified: a stream's labels are not known without reading every sample.
    """
    num_val = num_val_samples(num_samples, val_fraction, source)
    mask = np.zeros(num_samples, dtype=bool)
    chosen = np.random.default_rng([seed, _HOLD_OUT]).choice(num_samples, num_val, replace=False)
    mask[chosen] = True
    return mask
