"""Synthetic images of any size, generated chunk by chunk so memory does not grow with the count.

`make_synthetic` builds the whole set in memory; `dlscale data convert synthetic` writes data
sets larger than memory, so here the samples come in chunks of about `CHUNK_BYTES`. Each chunk
draws from its own generator, seeded by (seed, chunk index): the same seed and shape give the same
samples however far a run got, and no chunk depends on the previous one's state.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterator

import numpy as np

from dlscale.data.synthetic import IMAGE_NOISE_HALF_WIDTH

# About 4 MiB of uint8 samples a chunk (and two 16 MiB float32 buffers to draw it in): large
# enough that numpy works in bulk, small against any data set worth converting.
CHUNK_BYTES = 4 * 2**20
PIXEL_LEVELS = 255  # uint8: 0..255


def chunk_samples(shape: list[int]) -> int:
    """Samples per chunk for samples of `shape` (at least one)."""
    return max(1, CHUNK_BYTES // math.prod(shape))  # exact: numpy's int64 product wraps


def synthetic_image_chunks(
    num_samples: int, shape: list[int], num_classes: int, seed: int, start: int = 0
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Learnable images, `x = prototype[y] + noise` clamped to [0, 1] as in data/synthetic.py,
    stored as uint8: yields (first index, x uint8 (n, *shape), y int64 (n,)) chunks, from the
    chunk holding sample `start` to sample `num_samples` (chunks before it are not drawn)."""
    # Class prototypes come from the seed alone; chunk c from (seed, c): SeedSequence mixes the
    # pair, so chunk generators never share a stream with each other or with the prototypes.
    prototypes = np.random.default_rng([seed, 0]).random((num_classes, *shape), np.float32)
    per_chunk = chunk_samples(shape)
    # Peak memory must not grow with the number of chunks. Once glibc has freed one large block
    # it serves blocks of that size from its heap instead of fresh pages (its mmap threshold
    # rises), and a heap that chunk-sized blocks come and go from, between the encoder's small
    # allocations, grows: 24 chunks of 3×64×64 peaked 8–16 MiB above 3 chunks (0.2–0.6 MiB with
    # the threshold held by MALLOC_MMAP_THRESHOLD_). So every chunk is drawn into the same two
    # float32 buffers, allocated once, and each uint8 chunk handed out gets pages of its own
    # (mapped_uint8), unmapped when the consumer lets go of it.
    buffer = np.empty((min(per_chunk, num_samples), *shape), np.float32)  # (n, *shape)
    chosen = np.empty_like(buffer)  # the prototype of each sample's class
    for chunk in range(start // per_chunk, -(-num_samples // per_chunk)):
        first = chunk * per_chunk
        count = min(per_chunk, num_samples - first)
        rng = np.random.default_rng([seed, 1, chunk])
        y = rng.integers(num_classes, size=count, dtype=np.int64)  # (n,)
        x = rng.random(dtype=np.float32, out=buffer[:count])  # (n, *shape) in [0, 1)
        # Uniform noise in ±half width, in place: float32 throughout, no float64 temporaries.
        x *= 2 * IMAGE_NOISE_HALF_WIDTH
        np.take(prototypes, y, axis=0, out=chosen[:count])
        chosen[:count] -= IMAGE_NOISE_HALF_WIDTH
        x += chosen[:count]
        np.clip(x, 0.0, 1.0, out=x)
        x *= PIXEL_LEVELS
        stored = mapped_uint8(x.shape)
        np.copyto(stored, np.rint(x, out=x), casting="unsafe")  # exact integers 0..255
        yield first, stored, y


def mapped_uint8(shape: tuple[int, ...]) -> np.ndarray:
    """A uint8 array of `shape` in pages of its own (an anonymous mapping), given back to the
    system when its last view is dropped, never left behind as a hole in the C heap."""
    return np.frombuffer(mmap.mmap(-1, math.prod(shape)), np.uint8).reshape(shape)
