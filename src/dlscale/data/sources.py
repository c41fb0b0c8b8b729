"""What `dlscale data convert` reads: digits, synthetic at any size, or a spec's data, as chunks.

A source yields `(split, x, y)` chunks of NumPy arrays in the form they are stored: images as
uint8 (n, C, H, W) (0..255 for [0, 1]), features float32, token ids int64; labels int64 (n,), or
next tokens (n, T) for language modelling. A writer reports its `Progress` as it goes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dlscale.data.build import build_data
from dlscale.data.generate import PIXEL_LEVELS, chunk_samples, synthetic_image_chunks
from dlscale.data.holdout import num_val_samples
from dlscale.data.synthetic import check_fits_in_memory
from dlscale.errors import UserError
from dlscale.jobspec import DigitsData, SyntheticData, load_spec
from dlscale.jobspec.base import MAX_SEED

NAMED_SOURCES = ("digits", "synthetic")
DEFAULT_VAL_FRACTION = 0.2
SPLITS = ("train", "val")

Chunks = Iterator[tuple[str, np.ndarray, np.ndarray]]  # (split, x (n, ...), y (n, ...))
# What a writer reports as it goes: (samples written, samples in all).
Progress = Callable[[int, int], None]


@dataclass
class Source:
    """Samples to convert, and the facts about them that dataset.json records."""

    task: str
    num_classes: int
    vocab_size: int | None
    input_shape: list[int]
    dtype: str  # of the stored inputs: uint8 (images), float32 (features), int64 (tokens)
    counts: dict[str, int]  # samples per split: {"train": n, "val": m}
    chunks: Callable[..., Chunks]  # chunks(splits=SPLITS): those splits' samples, in order

    @property
    def images(self) -> bool:
        """Whether samples are (C, H, W) images a PNG can hold (grey or RGB uint8)."""
        return len(self.input_shape) == 3 and self.input_shape[0] in (1, 3)


def open_source(
    source: str | Path,
    samples: int | None = None,
    shape: list[int] | None = None,
    classes: int | None = None,
    seed: int | None = None,
    val_fraction: float | None = None,
) -> Source:
    """`digits`, `synthetic`, or a job spec (YAML) whose `data` section is read as training does.

    Options that do not apply to the source are refused rather than ignored.
    """
    given = {"--samples": samples, "--shape": shape, "--classes": classes}
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise UserError(f"--seed: {seed} is not between 0 and {MAX_SEED} (as a spec's seed)")
    if str(source) == "synthetic":
        return synthetic_source(samples, shape, classes, seed, val_fraction)
    if str(source) == "digits":
        _refuse(given, "apply to synthetic only, not to digits")
        spec = DigitsData(name="digits", val_fraction=_fraction(val_fraction))
        return memory_source(build_data(spec, seed or 0))
    path = Path(source)
    if path.suffix.lower() not in (".yaml", ".yml"):
        raise UserError(
            f"{source}: not a source: give digits, synthetic, or a job spec (.yaml) whose data "
            "section is read"
        )
    options = {**given, "--seed": seed, "--val-fraction": val_fraction}
    _refuse(options, f"not for a spec: {path.name}'s data section sets them")
    spec = load_spec(path)
    return memory_source(build_data(spec.data, spec.seed))


def synthetic_source(
    samples: int | None,
    shape: list[int] | None,
    classes: int | None,
    seed: int | None,
    val_fraction: float | None,
) -> Source:
    """Class prototypes plus noise, generated chunk by chunk: train first, then validation."""
    defaults = SyntheticData(name="synthetic")
    num_samples = defaults.num_samples if samples is None else samples
    shape = list(defaults.shape if shape is None else shape)
    num_classes = defaults.num_classes if classes is None else classes
    if num_samples < 1 or min(shape) < 1 or num_classes < 2:
        raise UserError("synthetic: --samples and --shape need positive sizes, --classes ≥ 2")
    _check_generation_memory(shape, num_classes)
    num_val = num_val_samples(num_samples, _fraction(val_fraction), "data 'synthetic'")
    num_train = num_samples - num_val

    def chunks(splits: tuple[str, ...] = SPLITS) -> Chunks:
        # Samples are i.i.d., so the first num_train train (as make_synthetic splits them).
        start = 0 if "train" in splits else num_train
        chunked = synthetic_image_chunks(num_samples, shape, num_classes, seed or 0, start)
        for first, x, y in chunked:
            cut = min(max(num_train - first, 0), len(x))
            if cut and "train" in splits:
                yield "train", x[:cut], y[:cut]
            if cut < len(x) and "val" in splits:
                yield "val", x[cut:], y[cut:]
            if first + len(x) >= num_train and "val" not in splits:
                return

    counts = {"train": num_train, "val": num_val}
    return Source("classification", num_classes, None, shape, "uint8", counts, chunks)


def memory_source(bundle) -> Source:
    """A data set read into memory by its reader (digits, npz, idx, cifar10, synthetic spec)."""
    if not bundle.in_memory:
        raise UserError(
            "convert reads digits, synthetic, npz, idx and cifar10 data; hf, webdataset and "
            "images data are already in a format training streams"
        )
    parts = {"train": bundle.train.tensors, "val": bundle.val.tensors}
    as_images = all(_is_image(x) for x, _ in parts.values())
    per_chunk = chunk_samples(list(bundle.input_shape))

    def chunks(splits: tuple[str, ...] = SPLITS) -> Chunks:
        for split in splits:
            x, y = parts[split]
            for start in range(0, len(x), per_chunk):
                end = start + per_chunk
                yield split, _stored(x[start:end], as_images), y[start:end].numpy()

    counts = {split: len(x) for split, (x, _) in parts.items()}
    shape = list(bundle.input_shape)
    x = bundle.train.tensors[0]
    dtype = "uint8" if as_images else "float32" if x.is_floating_point() else "int64"
    return Source(bundle.task, bundle.num_classes, bundle.vocab_size, shape, dtype, counts, chunks)


def _is_image(x: torch.Tensor) -> bool:
    """(N, C, H, W) floats in [0, 1]: images, stored as uint8 (a quarter of the bytes)."""
    if x.ndim != 4 or not x.is_floating_point() or len(x) == 0:
        return False
    return bool(x.min() >= 0) and bool(x.max() <= 1)


def _check_generation_memory(shape: list[int], num_classes: int) -> None:
    """Generating holds the class prototypes and two chunks of at least one sample as float32,
    and the chunk as uint8 (data/generate.py), however many samples are written."""
    chunk = chunk_samples(shape) * math.prod(shape)
    needed = 4 * (num_classes * math.prod(shape) + 2 * chunk) + chunk
    shown = ",".join(str(d) for d in shape)
    check_fits_in_memory(needed, f"synthetic: --shape {shown} and {num_classes} classes")


def _stored(x: torch.Tensor, as_images: bool) -> np.ndarray:
    if as_images:  # rounding to 256 levels moves a value by at most 1/510
        return torch.round(x * PIXEL_LEVELS).to(torch.uint8).numpy()
    if x.is_floating_point():
        return x.to(torch.float32).numpy()
    return x.to(torch.int64).numpy()


def _fraction(value: float | None) -> float:
    fraction = DEFAULT_VAL_FRACTION if value is None else value
    if not 0 < fraction < 1:
        raise UserError(f"--val-fraction: {fraction} is not between 0 and 1")
    return fraction


def _refuse(given: dict, why: str) -> None:
    """Options that do not apply to the source are a one-line error, not silently ignored."""
    unused = [name for name, value in given.items() if value is not None]
    if unused:
        raise UserError(f"{', '.join(unused)}: {why}")
