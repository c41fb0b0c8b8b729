"""Synthetic images of any size, generated chunk by chunk so memory does not grow with the count.

`make_synthetic` builds the whole set in memory; `dlscale data convert synthetic` writes data
sets larger than memory, so here the samples come in chunks of about `CHUNK_BYTES`. Each chunk
draws from its own generator, seeded by (seed, chunk index): the same seed and shape give the same
samples however far a run got, and no chunk depends on the previous one's state.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np

from dlscale.data.synthetic import IMAGE_NOISE_HALF_WIDTH

# About 4 MiB of uint8 samples a chunk (16 MiB of float32 while drawing): large enough that numpy
# works in bulk, small against any data set worth converting.
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
    for chunk in range(start // per_chunk, -(-num_samples // per_chunk)):
        first = chunk * per_chunk
        count = min(per_chunk, num_samples - first)
        rng = np.random.default_rng([seed, 1, chunk])
        y = rng.integers(num_classes, size=count, dtype=np.int64)  # (n,)
        x = rng.random((count, *shape), np.float32)  # (n, *shape) in [0, 1)
        # Uniform noise in ±half width, in place: float32 throughout, no float64 temporaries.
        x *= 2 * IMAGE_NOISE_HALF_WIDTH
        x += prototypes[y] - IMAGE_NOISE_HALF_WIDTH
        np.clip(x, 0.0, 1.0, out=x)
        yield first, np.rint(x * PIXEL_LEVELS).astype(np.uint8), y
